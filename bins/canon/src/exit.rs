//! The exit codes every cordon binary uses (brief §5), in one documented enum.
//!
//! A stage maps each of its errors to exactly one of these; `NoDecision` is never turned into a
//! pass or a fail by any caller.

/// How a cordon binary ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitCode {
    /// `0`: the stage established its result and the candidate passed.
    Ok,
    /// `1`: the candidate failed a check; the receipt says which. `cordon-policy diff` also uses
    /// 1 for "the files differ", as `diff(1)` does.
    Rejected,
    /// `2`: usage, policy or input-wiring error; no receipt is printed.
    Usage,
    /// `3`: no-decision: the infrastructure could not establish authority (runtime missing,
    /// cleanup or absence proof failed, device not drained).
    NoDecision,
}

impl ExitCode {
    /// The numeric process exit status.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Rejected => 1,
            Self::Usage => 2,
            Self::NoDecision => 3,
        }
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(code: ExitCode) -> Self {
        Self::from(code.code())
    }
}

/// The one mapping from an error to how its binary ends: every error type a binary reports
/// implements it, exhaustively, and nothing else decides an exit code from an error.
pub trait ExitClass {
    /// The exit code this error ends its binary with: [`ExitCode::Usage`] for the operator's
    /// wiring, [`ExitCode::NoDecision`] for what cordon could not establish.
    fn exit_class(&self) -> ExitCode;
}

/// Make a panic end the process with a no-decision (exit 3) instead of Rust's 101, after
/// printing it: a panic is a defect in cordon, never a verdict, and no cordon binary exits
/// outside 0–3. Every main installs it first.
pub fn no_decision_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("cordon::internal: {info}\n(a defect in cordon, not a verdict: no decision)");
        std::process::exit(i32::from(ExitCode::NoDecision.code()));
    }));
}

/// The whole of every cordon binary's `main`: the panic hook first (before an argument is
/// parsed or a thread exists), then `run`, whose code the process exits with.
pub fn main(run: impl FnOnce() -> ExitCode) -> std::process::ExitCode {
    no_decision_on_panic();
    run().into()
}

/// A binary's `cli::main` body: parse the arguments with `parse` (clap's, in each binary), then
/// `run` them against this process's stdout and stderr.
pub fn with_stdio<A>(
    parse: impl FnOnce() -> A,
    run: impl FnOnce(&A, &mut dyn std::io::Write, &mut dyn std::io::Write) -> ExitCode,
) -> ExitCode {
    let args = parse();
    run(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

/// [`with_stdio`] for a stage that also reads its input receipt from stdin.
pub fn with_stdin<A>(
    parse: impl FnOnce() -> A,
    run: impl FnOnce(
        &A,
        &mut dyn std::io::Read,
        &mut dyn std::io::Write,
        &mut dyn std::io::Write,
    ) -> ExitCode,
) -> ExitCode {
    let args = parse();
    run(
        &args,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

#[cfg(test)]
mod tests {
    use super::ExitCode;

    /// Run as its own child (the variable set), this test's process panics inside [`super::main`]:
    /// the hook must end it with exit 3, never Rust's 101.
    #[test]
    fn a_panic_under_main_is_a_no_decision() {
        if std::env::var_os("CORDON_PANIC_CHILD").is_some() {
            let _ = super::main(|| panic!("a defect"));
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--nocapture",
                "exit::tests::a_panic_under_main_is_a_no_decision",
            ])
            .env("CORDON_PANIC_CHILD", "1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("cordon::internal"));
    }

    #[test]
    fn codes_are_the_documented_numbers() {
        let all = [
            ExitCode::Ok,
            ExitCode::Rejected,
            ExitCode::Usage,
            ExitCode::NoDecision,
        ];
        assert_eq!(all.map(ExitCode::code), [0, 1, 2, 3]);
    }
}
