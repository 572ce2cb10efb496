//! Where a change of the canonical form is written in a policy file: the line of the KDL node
//! that says it, for `cordon-policy diff`'s `file:line`.
//!
//! The canonical form has no spans (the model is values only), so this walks the file's KDL
//! nodes along the change's canonical keys: a key names a node (`max_file_bytes` →
//! `max-file-bytes`, unit suffixes dropped as the language spells them) or is an argument of
//! one (`stage "lane"`, `mount "tree" "/engine"`, `allow "read" …`); a key written as neither
//! (a grouping only the canonical form has) is passed over. The line is the deepest
//! node the walk reaches; `None` when not even the first key is written (the value is the
//! language's default). It is a reader's pointer, never part of a decision.

use kdl::{KdlDocument, KdlNode};

use crate::diff::spelled;

fn has_arg(node: &KdlNode, value: &str) -> bool {
    node.entries()
        .iter()
        .any(|e| e.name().is_none() && e.value().as_string() == Some(value))
}

/// The 1-based line of the node `path` (canonical keys) is written on in `text`, if any.
#[must_use]
pub fn line(text: &str, path: &[String]) -> Option<usize> {
    let doc = KdlDocument::parse(text).ok()?;
    let mut nodes = doc.nodes();
    let mut found: Option<&KdlNode> = None;
    let mut i = 0;
    while i < path.len() {
        let name = spelled(&path[i]);
        let next = path.get(i + 1).map(String::as_str);
        let named: Vec<&KdlNode> = nodes.iter().filter(|n| n.name().value() == name).collect();
        // `stage "lane"` when this side has no such stage (the change added or removed it):
        // the walk stays where it is rather than step into a sibling entry.
        let entries = named
            .iter()
            .any(|node| node.entries().iter().any(|e| e.name().is_none()));
        if let Some(n) = next
            && entries
            && !named.iter().any(|node| has_arg(node, n))
            && !named.is_empty()
            && crate::diff::NAMED_MAPS.contains(&path[i].as_str())
        {
            break;
        }
        // `stage "lane"`: the node and its name argument, two keys at once.
        let pick = next
            .and_then(|n| named.iter().find(|node| has_arg(node, n)))
            .map(|node| (*node, 2))
            .or_else(|| named.first().map(|node| (*node, 1)))
            // `allow "read"`, `mount "tree" "/engine"`: the key is an argument.
            .or_else(|| {
                nodes
                    .iter()
                    .find(|node| has_arg(node, &path[i]))
                    .map(|node| (node, 1))
            });
        // A key the file does not write as a node (`syscall`: the canonical form's grouping
        // of `allow` and `deny` nodes) is passed over.
        let Some((node, used)) = pick else {
            i += 1;
            continue;
        };
        found = Some(node);
        i += used;
        match node.children() {
            Some(children) => nodes = children.nodes(),
            None => break,
        }
    }
    let offset = found?.span().offset();
    Some(text[..offset.min(text.len())].matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::line;

    fn p(s: &str) -> Vec<String> {
        s.split('|').map(str::to_owned).collect()
    }

    const TEXT: &str = "policy \"p\" version=1\nstage \"prebuild\" {\n    pids 1024\n}\nstage \"lane\" {\n    pids 4096\n    tmp size=\"1GiB\" exec=#false\n    mount \"tree\" \"/engine\" mode=\"ro\"\n}\nseccomp \"c\" {\n    allow \"read\" \"write\" reason=\"io\"\n}\n";

    #[test]
    fn a_change_is_found_on_its_node() {
        assert_eq!(line(TEXT, &p("stage|lane|pids")), Some(6));
        assert_eq!(line(TEXT, &p("stage|prebuild|pids")), Some(3));
        assert_eq!(line(TEXT, &p("stage|lane|tmp|exec")), Some(7));
        assert_eq!(line(TEXT, &p("stage|lane|mount|/engine|mode")), Some(8));
        assert_eq!(line(TEXT, &p("seccomp|c|syscall|write")), Some(11));
        // Not written: the stage's node, the nearest thing that is.
        assert_eq!(line(TEXT, &p("stage|lane|memory_bytes")), Some(5));
        // A stage this side does not have: nowhere, never a sibling stage's line.
        assert_eq!(line(TEXT, &p("stage|reference|pids")), None);
        assert_eq!(line(TEXT, &p("speed|min_margin_bp")), None);
    }
}
