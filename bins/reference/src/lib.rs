//! The quality authority (seed 001 §5): `cordon-reference` runs the pristine reference session
//! T after the candidate's sessions are proven gone, grades the incumbent's and the candidate's
//! outputs against T's, and prints the final verdict ([`cli`]); the referee's steps are in
//! [`referee`].

pub mod cli;
pub mod referee;
