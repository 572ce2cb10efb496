//! A command run with its stderr (and, when asked, its stdin) on a pseudo-terminal, as an
//! operator's shell would run it: the terminal cases of what a binary says (colour, the line
//! before a wait on stdin) are tested on a real terminal, never on a pipe pretending.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

/// What a command run on a terminal left.
#[derive(Debug)]
pub struct OnPty {
    /// Its exit code.
    pub code: Option<i32>,
    /// Its stdout (a pipe).
    pub stdout: Vec<u8>,
    /// What it wrote on the terminal, raw (escape sequences kept).
    pub terminal: String,
}

/// Run `cmd` with stderr on a new 80×24 pseudo-terminal, stdin too when `stdin_on_pty` (else
/// `/dev/null`), stdout a pipe; `typed` is written on the terminal first (`b"\x04"`: Ctrl-D, an
/// end of input).
pub fn run(mut cmd: Command, stdin_on_pty: bool, typed: &[u8]) -> OnPty {
    let size = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    cmd.stderr(Stdio::from(slave.try_clone().unwrap()));
    cmd.stdin(if stdin_on_pty {
        Stdio::from(slave.try_clone().unwrap())
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn on a pty");
    // The terminal ends (EIO on the master) once the child's copies of its side are closed.
    drop(cmd);
    drop(slave);
    let mut master = std::fs::File::from(pty.master);
    master.write_all(typed).unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match master.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        out
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let code = child.wait().unwrap().code();
    let terminal = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    OnPty {
        code,
        stdout,
        terminal,
    }
}
