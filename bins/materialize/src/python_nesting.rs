//! The nesting bound: a linear pre-scan of the token stream that refuses, before anything
//! recursive runs, a file whose syntax tree could be deep enough to exhaust a stack.
//!
//! `rustpython-parser`'s LR parser keeps its own stack on the heap, but three things that follow
//! it recurse once per level of the tree: the parser's own assignment-target pass (a few KiB of
//! stack per nested `[` in a target), the policy's visitor, and dropping the tree. A file of
//! 50 000 `-` signs, brackets, `elif`s or lambdas therefore aborts the process with no receipt.
//! This module lexes the file once (the parser then consumes the same tokens, so the scan sees
//! exactly what the parser will), and computes an upper bound on the depth of the tree the
//! tokens can produce:
//!
//! - every token that is not a leaf (a name, a number, a plain string) or a separator (`,` `;`
//!   newline) counts one level in its comma-separated segment; an opening bracket counts one
//!   level in its segment and opens a nested frame whose own bound is added; a segment's bound
//!   is its count plus its deepest frame, a frame's the largest of its segments. A `,` starts a
//!   sibling segment, except between `lambda` and its `:` (the body of `lambda a, b: …` lies
//!   under the lambda);
//! - a statement's bound adds two levels per enclosing indentation level and one per `elif`
//!   chained before it at each level (an `elif` is an `if` nested in the previous `orelse`);
//! - an f-string is parsed recursively by the parser: its replacement fields are scanned the way
//!   the parser reads them, and every non-word character inside a field counts one level.
//!
//! Closing brackets only ever lower the count through frames this scan opened itself, so
//! brackets inside strings and comments cannot hide depth; every approximation over-counts.
//! The bounds are CPython's own where it has them: [`MAX_BRACKETS`] is its tokenizer's
//! `MAXLEVEL` ("too many nested parentheses"), [`MAX_INDENT`] its `MAXINDENT`; [`MAX_DEPTH`] is
//! far below CPython's parser limit (`MAXSTACK`, 6000) and far above anything written by hand.
//! Refusing absurd code is the accepted cost; the scan never decides anything else.
//!
//! What it does not do: it does not bound the walk that follows (the visitor counts its own
//! depth as a second line), and it does not size the stack ([`crate::python::STACK_BYTES`] does).

use rustpython_parser::lexer::LexResult;
use rustpython_parser::text_size::TextRange;
use rustpython_parser::{Mode, Tok, lexer};

/// Nested brackets `( [ {` allowed, as CPython's tokenizer (`MAXLEVEL`).
pub const MAX_BRACKETS: usize = 200;
/// Indentation levels allowed, as CPython's tokenizer (`MAXINDENT`).
pub const MAX_INDENT: usize = 100;
/// The largest admitted upper bound on the depth of one statement's tree.
pub const MAX_DEPTH: usize = 1000;

/// Why a file is refused, and where.
#[derive(Debug)]
pub struct TooDeep {
    /// The token at which the bound was passed (the end of the statement for [`MAX_DEPTH`]).
    pub at: TextRange,
    /// Which bound, in words.
    pub why: String,
}

/// One bracket frame (or, at the bottom, one logical line).
#[derive(Default)]
struct Frame {
    /// Levels counted in the current comma-separated segment.
    seg: usize,
    /// The deepest closed frame inside the current segment.
    child: usize,
    /// The largest bound of the segments already closed.
    best: usize,
    /// `lambda`s whose `:` has not been seen yet: until then a `,` separates their parameters.
    lambdas: usize,
}

impl Frame {
    fn close_segment(&mut self) {
        self.best = self.bound();
        self.seg = 0;
        self.child = 0;
    }

    fn bound(&self) -> usize {
        self.best.max(self.seg + self.child)
    }
}

/// Lex `source` and bound its nesting. Returns the tokens for the parser.
///
/// # Errors
/// [`TooDeep`] when a bound is passed; a lexical error is left in the tokens for the parser to
/// report as a syntax error.
pub fn scan(source: &str) -> Result<Vec<LexResult>, TooDeep> {
    // Up to and including the first lexical error, where the parser stops (the lexer itself
    // may go on producing errors for ever).
    let mut tokens: Vec<LexResult> = Vec::new();
    for t in lexer::lex(source, Mode::Module) {
        let error = t.is_err();
        tokens.push(t);
        if error {
            break;
        }
    }
    // The logical line, and the bracket frames open in it.
    let mut line = Frame::default();
    let mut open: Vec<Frame> = Vec::new();
    // Per indentation level, the module's first: how many `elif`s are chained at it so far.
    let mut levels: Vec<usize> = vec![0];
    let mut line_start = true;
    let mut last = TextRange::default();
    for (tok, range) in tokens.iter().map_while(|t| t.as_ref().ok()) {
        last = *range;
        let at_line_start = std::mem::replace(&mut line_start, false);
        let frame = open.last_mut().unwrap_or(&mut line);
        match tok {
            Tok::Lpar | Tok::Lsqb | Tok::Lbrace => {
                frame.seg += 1;
                open.push(Frame::default());
                if open.len() > MAX_BRACKETS {
                    return Err(TooDeep {
                        at: *range,
                        why: format!("more than {MAX_BRACKETS} nested brackets"),
                    });
                }
            }
            // An unmatched closer is the parser's syntax error; it never lowers the count.
            Tok::Rpar | Tok::Rsqb | Tok::Rbrace => close(&mut line, &mut open),
            Tok::Comma if frame.lambdas == 0 => frame.close_segment(),
            Tok::Comma => {}
            Tok::Semi => frame.close_segment(),
            Tok::Lambda => {
                frame.seg += 1;
                frame.lambdas += 1;
            }
            Tok::Colon => {
                frame.seg += 1;
                frame.lambdas = frame.lambdas.saturating_sub(1);
            }
            Tok::Newline => {
                statement(&mut line, &levels, *range)?;
                line_start = true;
            }
            Tok::Indent => {
                levels.push(0);
                if levels.len() - 1 > MAX_INDENT {
                    return Err(TooDeep {
                        at: *range,
                        why: format!("more than {MAX_INDENT} levels of indentation"),
                    });
                }
                line_start = true;
            }
            Tok::Dedent => {
                if levels.len() > 1 {
                    levels.pop();
                }
                line_start = true;
            }
            Tok::Name { .. }
            | Tok::Int { .. }
            | Tok::Float { .. }
            | Tok::Complex { .. }
            | Tok::True
            | Tok::False
            | Tok::None
            | Tok::Ellipsis
            | Tok::EndOfFile => {}
            Tok::String { value, kind, .. } if kind.is_any_fstring() => {
                frame.seg += 2 + fstring_bound(value);
            }
            Tok::String { .. } => {}
            _ => frame.seg += 1,
        }
        if at_line_start
            && !matches!(tok, Tok::Indent | Tok::Dedent)
            && let Some(chain) = levels.last_mut()
        {
            match tok {
                Tok::Elif => *chain += 1,
                Tok::Else => {}
                _ => *chain = 0,
            }
        }
    }
    // Whatever is still open at the end (a missing newline, or brackets the parser will refuse)
    // is built by the parser before it gives up, so it is bounded too.
    while !open.is_empty() {
        close(&mut line, &mut open);
    }
    statement(&mut line, &levels, last)?;
    Ok(tokens)
}

/// Close the innermost bracket frame into the one around it.
fn close(line: &mut Frame, open: &mut Vec<Frame>) {
    if let Some(closed) = open.pop() {
        let parent = open.last_mut().unwrap_or(line);
        parent.child = parent.child.max(closed.bound());
    }
}

/// The end of a logical line: its bound, with the statement nesting around it.
fn statement(line: &mut Frame, levels: &[usize], at: TextRange) -> Result<(), TooDeep> {
    let statements: usize = levels.iter().map(|elifs| 2 + elifs).sum();
    let bound = line.bound() + statements;
    *line = Frame::default();
    if bound > MAX_DEPTH {
        return Err(TooDeep {
            at,
            why: format!("a statement nested up to {bound} levels deep (at most {MAX_DEPTH})"),
        });
    }
    Ok(())
}

/// An upper bound on the depth of the expressions in one f-string's replacement fields,
/// following the parser's own reading of them (`rustpython-parser`'s `string.rs`): outside a
/// field `{{` and `}}` are literal, `{` opens a field; inside one, quotes run to the same quote,
/// brackets nest, a `}` outside quotes and brackets closes it, and a format spec after `:` may
/// hold fields of its own. Where this reading goes wrong it stays inside a field too long,
/// which only over-counts; where it cannot follow at all, the rest of the string counts.
fn fstring_bound(value: &str) -> usize {
    let chars: Vec<char> = value.chars().collect();
    let mut i = 0;
    let mut deepest = 0;
    while i < chars.len() {
        match chars[i] {
            '{' if chars.get(i + 1) == Some(&'{') => i += 2,
            '{' => {
                let (levels, next) = field(&chars, i + 1);
                deepest = deepest.max(levels);
                let Some(next) = next else {
                    return deepest.max(rest_bound(&chars[i..]));
                };
                i = next;
            }
            // A backslash escape is skipped by the parser, but a brace after it is still read as
            // a brace: nothing to do but move on.
            _ => i += 1,
        }
    }
    deepest
}

/// One replacement field starting after its `{`: the levels counted in it, and the index after
/// its closing `}` (`None` when it never closes the way this reading expects).
fn field(chars: &[char], mut i: usize) -> (usize, Option<usize>) {
    let mut levels = 0;
    let mut open = 0usize;
    while let Some(&c) = chars.get(i) {
        i += 1;
        match c {
            '\'' | '"' => {
                levels += 1;
                loop {
                    let Some(&q) = chars.get(i) else {
                        return (levels, None);
                    };
                    i += 1;
                    if q == c {
                        break;
                    }
                    if !is_word(q) {
                        levels += 1;
                    }
                }
            }
            '(' | '[' | '{' => {
                levels += 1;
                open += 1;
            }
            ')' | ']' => {
                levels += 1;
                let Some(o) = open.checked_sub(1) else {
                    return (levels, None);
                };
                open = o;
            }
            '}' if open > 0 => {
                levels += 1;
                open -= 1;
            }
            '}' => return (levels, Some(i)),
            c if !is_word(c) => levels += 1,
            _ => {}
        }
    }
    (levels, None)
}

/// Every non-word character of what is left, the fallback when a field cannot be followed.
fn rest_bound(chars: &[char]) -> usize {
    chars.iter().filter(|c| !is_word(**c)).count()
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c.is_whitespace()
}
