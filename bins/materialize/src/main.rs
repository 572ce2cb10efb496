//! `cordon-materialize`: see the library's [`cordon_materialize::cli`]. Started with
//! [`cordon::confine::CHILD_ARG`] it is instead its own confined analysis child.

fn main() -> std::process::ExitCode {
    if let Some((spec, parent)) = cordon::confine::requested() {
        cordon::confine::run_child(&spec, parent, |kind| match kind {
            cordon_materialize::analysis::ANALYSIS_CHILD => {
                cordon_materialize::analysis::child_main()
            }
            _ => cordon::confine::UNCONFINED_EXIT,
        });
    }
    let args = <cordon_materialize::cli::Args as clap::Parser>::parse();
    cordon_materialize::cli::run(
        &args,
        std::path::Path::new("/proc/self/exe"),
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
