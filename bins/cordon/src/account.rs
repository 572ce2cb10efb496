//! Per-run accounts (REQ-117): a fresh user and group for every lease, with nonzero ids from
//! the policy's range, no login shell, no home, and denied cron and at; removed at release.
//!
//! Accounts are made and removed with the host's own `groupadd`/`useradd`/`userdel`/`groupdel`
//! (Debian's `passwd` package), so `/etc/passwd`, `/etc/shadow` and `/etc/group` are edited by
//! the tools that own their locking. If the name or either id already exists, nothing is
//! created and the run stops: an id in use may own files the run could then reach.
//!
//! Everything goes through the host seam: the tools, the reads of passwd and group (an
//! unreadable database is an error, never "no such account"), and the cron/at deny edits, which
//! are crash-safe and serialised ([`crate::host::Host::edit_file`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::host::{Host, Tool};

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
    /// The user database accounts are checked and listed in.
    pub passwd: PathBuf,
    /// The group database.
    pub group: PathBuf,
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
    /// An account database or deny file could not be read or edited.
    #[error("cannot {op} {path}")]
    #[diagnostic(code(cordon::account::database))]
    Database {
        /// What was done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn tool(host: &dyn Host, cmd: &str, args: &[&str]) -> Result<(), AccountError> {
    let t = Tool::new(cmd, args);
    let out = host.run(&t).map_err(|e| AccountError::Tool {
        command: t.display(),
        why: e.to_string(),
    })?;
    if out.success() {
        Ok(())
    } else {
        Err(AccountError::Tool {
            command: t.display(),
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

/// One database line: name, id, the group id of a passwd line, its comment (GECOS) field.
type Entry = (String, u32, Option<u32>, Option<String>);

/// Each [`Entry`] of a passwd- or group-format file, read through the seam.
fn entries(host: &dyn Host, path: &std::path::Path) -> Result<Vec<Entry>, AccountError> {
    let bytes = host.read(path).map_err(|source| AccountError::Database {
        op: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |why: String| AccountError::Database {
        op: "parse",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    };
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8".into()))?;
    // A line that does not parse is an error, not a line to skip: an entry cordon cannot read
    // may be the very name or id it is looking for.
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let id = f
                .get(2)
                .and_then(|i| i.parse().ok())
                .ok_or_else(|| bad(format!("unreadable entry {l:?}")))?;
            Ok((
                f.first().copied().unwrap_or_default().to_owned(),
                id,
                f.get(3).and_then(|g| g.parse().ok()),
                f.get(4).map(|c| (*c).to_owned()),
            ))
        })
        .collect()
}

/// What of a name, uid or gid is already in the host's account databases.
fn taken(
    host: &dyn Host,
    policy: &AccountPolicy,
    a: &Account,
) -> Result<Option<String>, AccountError> {
    let users = entries(host, &policy.passwd)?;
    let groups = entries(host, &policy.group)?;
    Ok(if users.iter().any(|(n, _, _, _)| *n == a.name) {
        Some("the name exists".into())
    } else if groups.iter().any(|(n, _, _, _)| *n == a.name) {
        Some("a group of that name exists".into())
    } else if users.iter().any(|(_, id, _, _)| *id == a.uid) {
        Some("the uid exists".into())
    } else if groups.iter().any(|(_, id, _, _)| *id == a.gid) {
        Some("the gid exists".into())
    } else {
        None
    })
}

/// Add or remove `name`'s line in a deny file, crash-safely and under a lock.
fn deny(
    host: &dyn Host,
    path: &std::path::Path,
    name: &str,
    present: bool,
) -> Result<(), AccountError> {
    let edit = |text: &str| -> Option<String> {
        let has = text.lines().any(|l| l.trim() == name);
        match (present, has) {
            (true, false) => {
                let mut t = text.to_owned();
                if !t.is_empty() && !t.ends_with('\n') {
                    t.push('\n');
                }
                Some(format!("{t}{name}\n"))
            }
            (false, true) => Some(
                text.lines()
                    .filter(|l| l.trim() != name)
                    .map(|l| format!("{l}\n"))
                    .collect(),
            ),
            _ => None,
        }
    };
    host.edit_file(path, &edit)
        .map_err(|source| AccountError::Database {
            op: "edit",
            path: path.to_path_buf(),
            source,
        })
}

/// Create the account: its group, the user (no home, no login shell), and cron/at denials.
///
/// # Errors
/// The name or an id is taken, a database is unreadable, or a tool failed.
pub fn create(
    host: &dyn Host,
    policy: &AccountPolicy,
    a: &Account,
    owner: &str,
) -> Result<(), AccountError> {
    if a.uid == 0 || a.gid == 0 {
        return Err(AccountError::Taken {
            name: a.name.clone(),
            uid: a.uid,
            gid: a.gid,
            why: "id 0 is root".into(),
        });
    }
    if let Some(why) = taken(host, policy, a)? {
        return Err(AccountError::Taken {
            name: a.name.clone(),
            uid: a.uid,
            gid: a.gid,
            why,
        });
    }
    let (uid, gid) = (a.uid.to_string(), a.gid.to_string());
    tool(host, "groupadd", &["--gid", &gid, &a.name])?;
    let shell = policy.shell.display().to_string();
    tool(
        host,
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
            owner,
            &a.name,
        ],
    )?;
    deny(host, &policy.cron_deny, &a.name, true)?;
    deny(host, &policy.at_deny, &a.name, true)
}

/// Remove the account, its group and its cron/at lines. Removing what is already gone is not
/// an error; a database that cannot be read is.
///
/// # Errors
/// A database is unreadable, or a tool failed on an account that exists.
pub fn remove(host: &dyn Host, policy: &AccountPolicy, a: &Account) -> Result<(), AccountError> {
    if entries(host, &policy.passwd)?
        .iter()
        .any(|(n, _, _, _)| *n == a.name)
    {
        tool(host, "userdel", &[&a.name])?;
    }
    if entries(host, &policy.group)?
        .iter()
        .any(|(n, _, _, _)| *n == a.name)
    {
        tool(host, "groupdel", &[&a.name])?;
    }
    deny(host, &policy.cron_deny, &a.name, false)?;
    deny(host, &policy.at_deny, &a.name, false)
}

/// The owner tag a per-run account carries in its comment (GECOS) field: the executor and a
/// digest of the store root, so recovery removes only its own executor's and store's accounts
/// even when several share the policy's range.
#[must_use]
pub fn owner_tag(executor: &str, store: &std::path::Path) -> String {
    let store = crate::canonical::Digest::of_bytes(store.as_os_str().as_encoded_bytes());
    format!("cordon {executor} {}", &store.hex()[..16])
}

/// [`in_range`], each account with the comment its passwd line carries (`None` for a group
/// left without its account): the owner tag of [`owner_tag`] when cordon made it.
///
/// # Errors
/// As [`in_range`].
pub fn in_range_with_owner(
    host: &dyn Host,
    policy: &AccountPolicy,
) -> Result<Vec<(Account, Option<String>)>, AccountError> {
    let comments: std::collections::BTreeMap<String, Option<String>> =
        entries(host, &policy.passwd)?
            .into_iter()
            .map(|(name, _, _, comment)| (name, comment))
            .collect();
    Ok(in_range(host, policy)?
        .into_iter()
        .map(|a| {
            let c = comments.get(&a.name).cloned().flatten();
            (a, c)
        })
        .collect())
}

/// Accounts named `cordon-…` with a uid in the policy's range, and groups named `cordon-…`
/// with a gid in the range that no such account owns (the leftovers of a crash between
/// `groupadd` and `useradd`): what recovery may remove. Anything else is never touched.
///
/// # Errors
/// The user or group database cannot be read: then nothing is known to be absent.
pub fn in_range(host: &dyn Host, policy: &AccountPolicy) -> Result<Vec<Account>, AccountError> {
    let mut out: Vec<Account> = entries(host, &policy.passwd)?
        .into_iter()
        .filter_map(|(name, uid, gid, _)| {
            (name.starts_with("cordon-") && (policy.uids.0..=policy.uids.1).contains(&uid)).then(
                || Account {
                    name,
                    uid,
                    gid: gid.unwrap_or(uid),
                },
            )
        })
        .collect();
    for (name, gid, _, _) in entries(host, &policy.group)? {
        if name.starts_with("cordon-")
            && (policy.gids.0..=policy.gids.1).contains(&gid)
            && !out.iter().any(|a| a.name == name)
        {
            out.push(Account {
                name,
                uid: gid,
                gid,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::host::ToolOutput;
    use crate::host::fake::{Call, Fake};

    /// The account rules the fake-backed tests of this crate use.
    pub(crate) fn policy() -> AccountPolicy {
        AccountPolicy {
            uids: (5000, 5999),
            gids: (5000, 5999),
            shell: "/usr/sbin/nologin".into(),
            cron_deny: "/etc/cron.deny".into(),
            at_deny: "/etc/at.deny".into(),
            passwd: "/etc/passwd".into(),
            group: "/etc/group".into(),
        }
    }

    fn account() -> Account {
        Account {
            name: "cordon-00000001".into(),
            uid: 5001,
            gid: 5001,
        }
    }

    /// Id 0, user or group alone, is never created; removal runs each tool only for what
    /// exists; the range holds `cordon-` accounts by uid and left-over groups by gid, nothing
    /// else.
    #[test]
    fn ids_zero_are_refused_and_removal_and_the_range_see_only_what_is_there() {
        let f = Fake::new();
        f.file("/etc/passwd", "alice:x:1000:1000::/:/bin/sh\n")
            .file("/etc/group", "alice:x:1000:\n");
        for (uid, gid) in [(0, 5001), (5001, 0)] {
            let a = Account {
                uid,
                gid,
                ..account()
            };
            assert!(matches!(
                create(&f, &policy(), &a, "cordon t 0"),
                Err(AccountError::Taken { .. })
            ));
        }
        assert!(!f.calls().iter().any(|c| matches!(c, Call::Run(_))));
        // Nothing there: no tool runs. The group alone: only groupdel.
        remove(&f, &policy(), &account()).unwrap();
        assert!(!f.calls().iter().any(|c| matches!(c, Call::Run(_))));
        f.file("/etc/group", "cordon-00000001:x:5001:\n");
        remove(&f, &policy(), &account()).unwrap();
        let runs: Vec<String> = f.runs();
        assert_eq!(runs, ["groupdel cordon-00000001"]);
        // The range: a cordon- account in range, a group left alone in range; not an account
        // out of range, another name in range, or a group an account owns.
        let f = Fake::new();
        f.file(
            "/etc/passwd",
            "cordon-00000001:x:5001:5001::/:/bin/false\n\
             cordon-00000009:x:9001:9001::/:/bin/false\n\
             alice:x:5002:5002::/:/bin/sh\n",
        )
        .file(
            "/etc/group",
            "cordon-00000001:x:5001:\ncordon-00000003:x:5003:\ncordon-00000004:x:9004:\nbob:x:5005:\n",
        );
        let mut names: Vec<String> = in_range(&f, &policy())
            .unwrap()
            .into_iter()
            .map(|a| a.name)
            .collect();
        names.sort();
        assert_eq!(names, ["cordon-00000001", "cordon-00000003"]);
    }

    #[test]
    fn an_unreadable_passwd_is_an_error_never_nothing_left() {
        let f = Fake::new();
        f.unreadable("/etc/passwd").file("/etc/group", "");
        assert!(matches!(
            in_range(&f, &policy()),
            Err(AccountError::Database { .. })
        ));
        assert!(matches!(
            create(&f, &policy(), &account(), "cordon t 0"),
            Err(AccountError::Database { .. })
        ));
        assert!(matches!(
            remove(&f, &policy(), &account()),
            Err(AccountError::Database { .. })
        ));
        // Nothing was created on the strength of an unread database.
        assert!(!f.calls().iter().any(|c| matches!(c, Call::Run(_))));
    }

    #[test]
    fn create_then_remove_edits_both_deny_files_and_runs_the_tools_in_order() {
        let f = Fake::new();
        f.file("/etc/passwd", "root:x:0:0::/root:/bin/sh\n")
            .file("/etc/group", "root:x:0:\n")
            .file("/etc/cron.deny", "alice");
        create(&f, &policy(), &account(), "cordon t 0").unwrap();
        assert_eq!(
            f.text(std::path::Path::new("/etc/cron.deny")).unwrap(),
            "alice\ncordon-00000001\n"
        );
        assert_eq!(
            f.text(std::path::Path::new("/etc/at.deny")).unwrap(),
            "cordon-00000001\n"
        );
        let runs: Vec<String> = f.runs();
        assert!(
            runs[0].starts_with("groupadd") && runs[1].starts_with("useradd"),
            "{runs:?}"
        );
        f.file(
            "/etc/passwd",
            "root:x:0:0::/root:/bin/sh\ncordon-00000001:x:5001:5001::/nonexistent:/usr/sbin/nologin\n",
        );
        remove(&f, &policy(), &account()).unwrap();
        assert_eq!(
            f.text(std::path::Path::new("/etc/cron.deny")).unwrap(),
            "alice\n"
        );
        assert!(
            f.calls()
                .iter()
                .any(|c| matches!(c, Call::Run(l) if l.starts_with("userdel")))
        );
    }

    #[test]
    fn a_taken_id_or_a_failing_tool_or_deny_edit_is_an_error() {
        let f = Fake::new();
        f.file("/etc/passwd", "x:x:5001:1::/:/bin/sh\n")
            .file("/etc/group", "");
        assert!(matches!(
            create(&f, &policy(), &account(), "cordon t 0"),
            Err(AccountError::Taken { .. })
        ));
        let f = Fake::new();
        f.file("/etc/passwd", "").file("/etc/group", "");
        f.reply("useradd", ToolOutput::failed("useradd: boom"));
        assert!(matches!(
            create(&f, &policy(), &account(), "cordon t 0"),
            Err(AccountError::Tool { .. })
        ));
        let f = Fake::new();
        f.file("/etc/passwd", "")
            .file("/etc/group", "")
            .fail(false, false, true);
        assert!(matches!(
            create(&f, &policy(), &account(), "cordon t 0"),
            Err(AccountError::Database { op: "edit", .. })
        ));
    }
}
