//! `cordon-docs OUT`: write the man pages and completions of every cordon binary under OUT.

fn main() -> std::process::ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: cordon-docs OUT");
        return std::process::ExitCode::from(2);
    };
    match cordon_docs::write(std::path::Path::new(&out)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cordon-docs: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
