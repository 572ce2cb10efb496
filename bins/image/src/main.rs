//! `cordon-image`: see the library's [`cordon_image::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_image::cli::main)
}
