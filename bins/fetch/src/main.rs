//! `cordon-fetch`: see the library's [`cordon_fetch::cli`]. Started with
//! [`cordon::confine::CHILD_ARG`] it is instead its own confined archive parser child.

fn main() -> std::process::ExitCode {
    if let Some((spec, parent)) = cordon::confine::requested() {
        cordon::confine::run_child(&spec, parent, |kind| match kind {
            cordon::intake::ARCHIVE_CHILD => cordon::intake::archive_child(
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
            ),
            _ => cordon::confine::UNCONFINED_EXIT,
        });
    }
    let args = <cordon_fetch::cli::Args as clap::Parser>::parse();
    cordon_fetch::cli::run(
        &args,
        std::path::Path::new("/proc/self/exe"),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
    .into()
}
