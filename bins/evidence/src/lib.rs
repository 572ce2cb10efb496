//! What every stage writes and every auditor reads, below the mechanism and beside the policy
//! language: the receipt and its stage names and outcomes ([`receipt`]), the typed inputs of
//! every stage and the surface's outputs ([`inputs`]), a qualification's record ([`qualify`]),
//! what an executor left and what reap established ([`residue`]), a GPU's facts and the device
//! guard's pure rules ([`device`]), the stored form of a session's
//! output tokens ([`outputs`]), the pure speed and quality rules and verdicts ([`speed`],
//! [`quality`]), the audit role's records ([`audit`]) and the referee's records and final rule
//! ([`verdict`]) that `cordon-verify` recomputes. It reads no store and runs nothing; the
//! one clock and host read it still makes is the receipt's own timestamps and host facts
//! ([`receipt::Receipt::new`]).

pub mod audit;
pub mod device;
pub mod examples;
pub mod inputs;
pub mod outputs;
pub mod qualify;
pub mod quality;
pub mod receipt;
pub mod residue;
pub mod schema;
pub mod speed;
pub mod verdict;
