//! The quality authority (seed 001 §5): `cordon-reference` runs the pristine reference session
//! T after the candidate's sessions are proven gone, grades the incumbent's and the candidate's
//! outputs (and the candidate's audit, [`audit`]) against T's, and prints the final verdict
//! ([`cli`]); the referee's steps are in [`referee`].

pub mod audit;
pub mod cli;
pub mod referee;
