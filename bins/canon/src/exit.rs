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

/// Make a panic end the process with a no-decision (exit 3) instead of Rust's 101, after
/// printing it: a panic is a defect in cordon, never a verdict, and no cordon binary exits
/// outside 0–3. Every main installs it first.
pub fn no_decision_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("cordon::internal: {info}\n(a defect in cordon, not a verdict: no decision)");
        std::process::exit(i32::from(ExitCode::NoDecision.code()));
    }));
}

#[cfg(test)]
mod tests {
    use super::ExitCode;

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
