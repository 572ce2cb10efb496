//! What a cordon binary says on stderr besides its errors, and how stderr can show it.
//!
//! It owns the process's voice level ([`Level`]: `-q` says only errors, `-v` says each step),
//! the moment it was set (a stage's summary line gives its duration from it), how a
//! duration reads ([`duration`]), and what stderr can display ([`Style`]): colour only on a
//! terminal and never under `NO_COLOR` or `TERM=dumb`, Unicode only when the locale is UTF-8
//! and the terminal is not dumb, wrapping at the terminal's width and never when stderr is not
//! a terminal (a digest piped to a file or a log is never split). The diagnostics renderer
//! every binary uses is built here ([`Style::handler`]), so the three places that render
//! diagnostics cannot drift apart.
//!
//! It does not decide what a stage says (each stage does) and never writes candidate text: its
//! callers escape that first ([`crate::text`]), and colour is added only around cordon's own
//! words.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use miette::{GraphicalReportHandler, GraphicalTheme};

/// How much a binary says on stderr beyond its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `-q`: errors only (a receipt's reasons still reach stdout in the receipt).
    Quiet,
    /// The default: errors, one summary line at the end, a line before any long wait.
    Normal,
    /// `-v`: also each step (the policy, the authority, the store, the lease).
    Verbose,
}

static LEVEL: AtomicU8 = AtomicU8::new(1);
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Set this process's level (once, from its arguments, first thing): the moment this is
/// first called is the start a summary line's duration counts from.
pub fn set_level(level: Level) {
    let _ = STARTED.get_or_init(Instant::now);
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// This process's level.
#[must_use]
pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        0 => Level::Quiet,
        1 => Level::Normal,
        _ => Level::Verbose,
    }
}

/// Whether a line of `at` is said at this process's level.
#[must_use]
pub fn says(at: Level) -> bool {
    level() >= at
}

/// Write `line` (cordon's own words; any hostile character in it escaped) on `stderr` when
/// this process says lines of `at`. A closed stderr is ignored: the exit code and the receipt
/// still tell.
pub fn say(stderr: &mut dyn std::io::Write, at: Level, line: &str) {
    if says(at) {
        let _ = writeln!(stderr, "{}", crate::text::printable(line));
    }
}

/// How long since [`set_level`] was first called (zero if it never was).
#[must_use]
pub fn elapsed() -> Duration {
    STARTED.get().map_or(Duration::ZERO, Instant::elapsed)
}

/// A duration as an operator reads it: `840 ms`, `1.3 s`, `2 min 05 s`, `1 h 02 min`.
#[must_use]
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 60 {
        format!("{}.{} s", s, (ms % 1000) / 100)
    } else if s < 3600 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{} h {:02} min", s / 3600, (s % 3600) / 60)
    }
}

/// A byte count as an operator reads it: `512 B`, `3.4 KiB`, `612.0 MiB`, `1.2 GiB`.
#[must_use]
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n;
    let mut unit = 0;
    while value >= 1024 * 1024 && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    // One decimal from the last division, in integers.
    format!(
        "{}.{} {}",
        value / 1024,
        (value % 1024) * 10 / 1024,
        UNITS[unit]
    )
}

/// How often [`Progress`] redraws its line.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// How far a long transfer or copy has come, on one redrawn line of this process's stderr,
/// only when stderr is a terminal and the level is not `-q` (otherwise it only counts): bytes
/// so far and the rate, redrawn at most every [`PROGRESS_EVERY`], the line finished by
/// [`Meter::finish`] or when dropped.
pub struct Meter {
    label: String,
    shown: bool,
    enabled: bool,
    count: u64,
    started: Instant,
    drawn: Instant,
}

impl Meter {
    /// A meter labelled `label` (`cordon-fetch: read`).
    pub fn new(label: impl Into<String>) -> Self {
        let now = Instant::now();
        Self {
            label: label.into(),
            shown: false,
            enabled: Style::stderr().terminal && says(Level::Normal),
            count: 0,
            started: now,
            drawn: now,
        }
    }

    /// Count `n` more bytes, redrawing the line when it is due.
    pub fn add(&mut self, n: u64) {
        self.count = self.count.saturating_add(n);
        if self.enabled && self.drawn.elapsed() >= PROGRESS_EVERY {
            self.drawn = Instant::now();
            self.shown = true;
            self.draw(false);
        }
    }

    /// Finish the line, if one was drawn.
    pub fn finish(&mut self) {
        if self.shown {
            self.draw(true);
            self.shown = false;
        }
    }

    fn draw(&self, last: bool) {
        use std::io::Write;
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        // A rate shown to one decimal: the precision lost to the float is invisible.
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let rate = (self.count as f64 / secs) as u64;
        let end = if last { "\n" } else { "" };
        let _ = write!(
            std::io::stderr(),
            "\r\u{1b}[K{} {} ({}/s){end}",
            crate::text::printable(&self.label),
            bytes(self.count),
            bytes(rate)
        );
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A reader whose bytes a [`Meter`] counts: a transfer's progress.
pub struct Progress<R> {
    inner: R,
    meter: Meter,
}

impl<R> Progress<R> {
    /// `inner`, its progress labelled `label` (`cordon-fetch: read`).
    pub fn new(inner: R, label: impl Into<String>) -> Self {
        Self {
            inner,
            meter: Meter::new(label),
        }
    }

    /// The reader inside.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }
}

impl<R: std::io::Read> std::io::Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 {
            self.meter.finish();
        } else {
            self.meter.add(n as u64);
        }
        Ok(n)
    }
}

/// A colour for cordon's own words (an outcome), never for candidate text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    /// Established and passed.
    Green,
    /// Established and failed.
    Red,
    /// Not established.
    Yellow,
}

/// What stderr can display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Whether stderr is a terminal.
    pub terminal: bool,
    /// Whether ANSI colour may be written.
    pub colour: bool,
    /// Whether characters beyond ASCII may be written (box drawing, `·`).
    pub unicode: bool,
    /// The column to wrap at; `None`: never wrap.
    pub width: Option<usize>,
}

/// The width a terminal whose size cannot be read is wrapped at.
const FALLBACK_WIDTH: usize = 100;

impl Style {
    /// This process's stderr, read from the environment and the descriptor.
    #[must_use]
    pub fn stderr() -> Self {
        let terminal = std::io::stderr().is_terminal();
        let width = terminal.then(|| {
            terminal_size::terminal_size_of(std::io::stderr())
                .map(|(w, _)| usize::from(w.0))
                .filter(|w| *w > 0)
                .unwrap_or(FALLBACK_WIDTH)
        });
        Self::from_env(terminal, width, |k| std::env::var_os(k))
    }

    /// The style for a stderr that is (`terminal`) or is not a terminal `width` columns wide,
    /// under the environment `var` reads: colour only on a terminal, never with `NO_COLOR` set
    /// non-empty (no-color.org) or `TERM=dumb`; Unicode only when the locale (`LC_ALL`, else
    /// `LC_CTYPE`, else `LANG`) names UTF-8 and `TERM` is not `dumb`.
    #[must_use]
    pub fn from_env(
        terminal: bool,
        width: Option<usize>,
        var: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Self {
        let set = |k: &str| var(k).filter(|v| !v.is_empty());
        let dumb = set("TERM").is_some_and(|t| t == "dumb");
        let locale = set("LC_ALL")
            .or_else(|| set("LC_CTYPE"))
            .or_else(|| set("LANG"))
            .map(|l| l.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        let utf8 = locale.contains("utf-8") || locale.contains("utf8");
        Self {
            terminal,
            colour: terminal && !dumb && set("NO_COLOR").is_none(),
            unicode: utf8 && !dumb,
            width: if terminal { width } else { None },
        }
    }

    /// A fixed style: Unicode, no colour, wrapped at `width` (the golden tests' interface).
    #[must_use]
    pub const fn fixed(width: usize) -> Self {
        Self {
            terminal: false,
            colour: false,
            unicode: true,
            width: Some(width),
        }
    }

    /// The diagnostics renderer for this style: never colour (a rendered diagnostic may hold
    /// candidate text and is escaped after rendering, which would escape colour codes too),
    /// ASCII art unless Unicode can be shown, wrapped only at a known width, no hyperlinks.
    #[must_use]
    pub fn handler(&self) -> GraphicalReportHandler {
        let theme = if self.unicode {
            GraphicalTheme::unicode_nocolor()
        } else {
            GraphicalTheme::none()
        };
        let handler = GraphicalReportHandler::new_themed(theme).with_links(false);
        match self.width {
            Some(w) => handler.with_width(w),
            None => handler.with_wrap_lines(false),
        }
    }

    /// `text` (cordon's own words, never candidate text) in `colour`, when colour may be
    /// written.
    #[must_use]
    pub fn paint(&self, colour: Colour, text: &str) -> String {
        if !self.colour {
            return text.to_owned();
        }
        let code = match colour {
            Colour::Green => 32,
            Colour::Red => 31,
            Colour::Yellow => 33,
        };
        format!("\u{1b}[{code}m{text}\u{1b}[0m")
    }

    /// The separator between a summary line's parts: `·`, or `-` in ASCII.
    #[must_use]
    pub const fn dot(&self) -> &'static str {
        if self.unicode { " · " } else { " - " }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn colour_only_on_a_terminal_and_never_under_no_color_or_a_dumb_terminal() {
        let utf8 = [("LANG", "en_US.UTF-8")];
        assert!(Style::from_env(true, Some(80), env(&utf8)).colour);
        assert!(!Style::from_env(false, Some(80), env(&utf8)).colour);
        assert!(
            !Style::from_env(
                true,
                Some(80),
                env(&[("LANG", "C.UTF-8"), ("NO_COLOR", "1")])
            )
            .colour
        );
        // An empty NO_COLOR is unset (no-color.org).
        assert!(Style::from_env(true, Some(80), env(&[("NO_COLOR", "")])).colour);
        assert!(!Style::from_env(true, Some(80), env(&[("TERM", "dumb")])).colour);
    }

    #[test]
    fn unicode_only_under_a_utf8_locale_and_a_terminal_that_is_not_dumb() {
        assert!(Style::from_env(false, None, env(&[("LANG", "en_US.UTF-8")])).unicode);
        assert!(Style::from_env(false, None, env(&[("LC_CTYPE", "C.utf8")])).unicode);
        assert!(!Style::from_env(false, None, env(&[("LANG", "C")])).unicode);
        assert!(!Style::from_env(false, None, env(&[])).unicode);
        // LC_ALL outranks LANG.
        assert!(
            !Style::from_env(
                false,
                None,
                env(&[("LC_ALL", "C"), ("LANG", "en_US.UTF-8")])
            )
            .unicode
        );
        assert!(
            !Style::from_env(true, None, env(&[("LANG", "C.UTF-8"), ("TERM", "dumb")])).unicode
        );
    }

    #[test]
    fn never_wrapped_when_not_a_terminal() {
        assert_eq!(Style::from_env(false, Some(80), env(&[])).width, None);
        assert_eq!(Style::from_env(true, Some(80), env(&[])).width, Some(80));
    }

    #[test]
    fn byte_counts_read_as_an_operator_reads_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 + 512), "3.5 KiB");
        assert_eq!(bytes(612 << 20), "612.0 MiB");
        assert_eq!(bytes((1 << 30) + (1 << 29)), "1.5 GiB");
    }

    /// Run as its own child with stderr on a pseudo-terminal, this test's process meters a
    /// slow copy: the line is redrawn in place and finished; piped, nothing is drawn.
    #[test]
    fn a_meter_draws_on_a_terminal_and_never_on_a_pipe() {
        if std::env::var_os("CORDON_METER_CHILD").is_some() {
            let mut meter = Meter::new("test: copying");
            for _ in 0..3 {
                std::thread::sleep(PROGRESS_EVERY);
                meter.add(2 << 20);
            }
            return;
        }
        let child = || {
            let mut c = std::process::Command::new(std::env::current_exe().unwrap());
            c.args([
                "--exact",
                "--nocapture",
                "voice::tests::a_meter_draws_on_a_terminal_and_never_on_a_pipe",
            ])
            .env("CORDON_METER_CHILD", "1");
            c
        };
        let tty = cordon_testkit::pty::run(child(), false, b"");
        assert_eq!(tty.code, Some(0), "{}", tty.terminal);
        assert!(
            tty.terminal.contains("\r\u{1b}[Ktest: copying 6.0 MiB (")
                && tty.terminal.contains("/s)\r\n"),
            "{:?}",
            tty.terminal
        );
        let piped = child().output().unwrap();
        assert!(piped.status.success());
        assert!(!String::from_utf8_lossy(&piped.stderr).contains("test: copying"));
    }

    #[test]
    fn progress_passes_every_byte_through() {
        use std::io::Read;
        let data = vec![7u8; 100_000];
        let mut p = Progress::new(&data[..], "test: read");
        let mut out = Vec::new();
        p.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn durations_read_as_an_operator_reads_them() {
        assert_eq!(duration(Duration::from_millis(840)), "840 ms");
        assert_eq!(duration(Duration::from_millis(1340)), "1.3 s");
        assert_eq!(duration(Duration::from_secs(125)), "2 min 05 s");
        assert_eq!(duration(Duration::from_secs(3720)), "1 h 02 min");
    }

    #[test]
    fn paint_is_plain_without_colour() {
        let plain = Style::fixed(100);
        assert_eq!(plain.paint(Colour::Red, "rejected"), "rejected");
        let mut tty = plain;
        tty.colour = true;
        assert_eq!(
            tty.paint(Colour::Red, "rejected"),
            "\u{1b}[31mrejected\u{1b}[0m"
        );
    }

    #[test]
    fn the_ascii_renderer_writes_no_character_beyond_ascii() {
        #[derive(Debug, thiserror::Error, miette::Diagnostic)]
        #[error(
            "a long message with sha256:0000000000000000000000000000000000000000000000000000000000000000 in it"
        )]
        #[diagnostic(code(cordon::test), help("a help line"))]
        struct E {
            #[source_code]
            src: String,
            #[label("here")]
            at: miette::SourceSpan,
        }
        let e = E {
            src: "policy \"p\" version=1\n".into(),
            at: (0, 6).into(),
        };
        let ascii = Style::from_env(false, None, env(&[("LANG", "C")]));
        let mut out = String::new();
        ascii.handler().render_report(&mut out, &e).unwrap();
        assert!(out.is_ascii(), "{out}");
        // Not a terminal: the digest is on one line, never split.
        assert!(
            out.lines().any(|l| l.contains(
                "sha256:0000000000000000000000000000000000000000000000000000000000000000"
            )),
            "{out}"
        );
    }
}
