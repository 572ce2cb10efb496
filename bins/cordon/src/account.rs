//! Per-run accounts (REQ-117): a fresh user and group for every lease, with nonzero ids from
//! the policy's range, no login shell, no home, and denied cron and at; removed at release.
//!
//! Accounts are made and removed with the host's own `groupadd`/`useradd`/`userdel`/`groupdel`
//! (Debian's `passwd` package), so `/etc/passwd`, `/etc/shadow` and `/etc/group` are edited by
//! the tools that own their locking. If the name or either id already exists, nothing is
//! created and the run stops: an id in use may own files the run could then reach.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The policy's account settings, in plain form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountPolicy {
    /// First and last uid.
    pub uids: (u32, u32),
    /// First and last gid.
    pub gids: (u32, u32),
    /// The login shell (a no-login one).
    pub shell: PathBuf,
    /// cron's deny file.
    pub cron_deny: PathBuf,
    /// at's deny file.
    pub at_deny: PathBuf,
}

/// One per-run account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// `cordon-<8 hex>`.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its gid (its own group's).
    pub gid: u32,
}

/// Why an account could not be made or removed. Always a no-decision.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum AccountError {
    /// The name or an id is already taken.
    #[error("account {name} (uid {uid}, gid {gid}) cannot be created: {why}")]
    #[diagnostic(
        code(cordon::account::taken),
        help("run cordon-reap to remove orphan accounts; never reuse an id that owns files")
    )]
    Taken {
        /// The name.
        name: String,
        /// The uid.
        uid: u32,
        /// The gid.
        gid: u32,
        /// What is taken.
        why: String,
    },
    /// A host tool failed.
    #[error("`{command}` failed: {why}")]
    #[diagnostic(code(cordon::account::tool))]
    Tool {
        /// The command.
        command: String,
        /// What it said.
        why: String,
    },
}

fn tool(cmd: &str, args: &[&str]) -> Result<(), AccountError> {
    let out = Command::new(cmd)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| AccountError::Tool {
            command: cmd.to_owned(),
            why: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(AccountError::Tool {
            command: format!("{cmd} {}", args.join(" ")),
            why: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// The account a lease gets: its name from the lease id, its ids at a lease-derived offset in
/// the ranges.
#[must_use]
pub fn for_lease(policy: &AccountPolicy, lease: &str) -> Account {
    let hex: String = lease
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect();
    let n = u32::from_str_radix(&hex, 16).unwrap_or(0);
    let pick = |(first, last): (u32, u32)| first + n % (last - first + 1);
    Account {
        name: format!("cordon-{hex}"),
        uid: pick(policy.uids),
        gid: pick(policy.gids),
    }
}

/// Whether a name, uid or gid is in the host's account databases.
fn taken(a: &Account) -> Option<String> {
    use nix::unistd::{Gid, Group, Uid, User};
    if User::from_name(&a.name).ok().flatten().is_some() {
        return Some("the name exists".into());
    }
    if Group::from_name(&a.name).ok().flatten().is_some() {
        return Some("a group of that name exists".into());
    }
    if User::from_uid(Uid::from_raw(a.uid))
        .ok()
        .flatten()
        .is_some()
    {
        return Some("the uid exists".into());
    }
    if Group::from_gid(Gid::from_raw(a.gid))
        .ok()
        .flatten()
        .is_some()
    {
        return Some("the gid exists".into());
    }
    None
}

fn append_line(path: &Path, line: &str) -> Result<(), AccountError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| AccountError::Tool {
            command: format!("append to {}", path.display()),
            why: e.to_string(),
        })?;
    writeln!(f, "{line}").map_err(|e| AccountError::Tool {
        command: format!("append to {}", path.display()),
        why: e.to_string(),
    })
}

fn remove_line(path: &Path, line: &str) -> Result<(), AccountError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    if !text.lines().any(|l| l.trim() == line) {
        return Ok(());
    }
    let kept: String = text
        .lines()
        .filter(|l| l.trim() != line)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).map_err(|e| AccountError::Tool {
        command: format!("rewrite {}", path.display()),
        why: e.to_string(),
    })
}

/// Create the account: its group, the user (no home, no login shell), and cron/at denials.
///
/// # Errors
/// The name or an id is taken, or a tool failed.
pub fn create(policy: &AccountPolicy, a: &Account) -> Result<(), AccountError> {
    if a.uid == 0 || a.gid == 0 {
        return Err(AccountError::Taken {
            name: a.name.clone(),
            uid: a.uid,
            gid: a.gid,
            why: "id 0 is root".into(),
        });
    }
    if let Some(why) = taken(a) {
        return Err(AccountError::Taken {
            name: a.name.clone(),
            uid: a.uid,
            gid: a.gid,
            why,
        });
    }
    let (uid, gid) = (a.uid.to_string(), a.gid.to_string());
    tool("groupadd", &["--gid", &gid, &a.name])?;
    let shell = policy.shell.display().to_string();
    tool(
        "useradd",
        &[
            "--uid",
            &uid,
            "--gid",
            &gid,
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            &shell,
            "--no-user-group",
            "--comment",
            "cordon per-run account",
            &a.name,
        ],
    )?;
    append_line(&policy.cron_deny, &a.name)?;
    append_line(&policy.at_deny, &a.name)
}

/// Remove the account, its group and its cron/at lines. Removing what is already gone is not
/// an error.
///
/// # Errors
/// A tool failed on an account that exists.
pub fn remove(policy: &AccountPolicy, a: &Account) -> Result<(), AccountError> {
    use nix::unistd::{Group, User};
    if User::from_name(&a.name).ok().flatten().is_some() {
        tool("userdel", &[&a.name])?;
    }
    if Group::from_name(&a.name).ok().flatten().is_some() {
        tool("groupdel", &[&a.name])?;
    }
    remove_line(&policy.cron_deny, &a.name)?;
    remove_line(&policy.at_deny, &a.name)
}

/// Accounts named `cordon-…` with a uid in the policy's range: what recovery may remove.
/// Anything else is never touched.
#[must_use]
pub fn in_range(policy: &AccountPolicy, passwd: &Path) -> Vec<Account> {
    let Ok(text) = std::fs::read_to_string(passwd) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let (name, uid, gid) = (f.first()?, f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?);
            (name.starts_with("cordon-") && (policy.uids.0..=policy.uids.1).contains(&uid)).then(
                || Account {
                    name: (*name).to_owned(),
                    uid,
                    gid,
                },
            )
        })
        .collect()
}
