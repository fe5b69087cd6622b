//! The commands of the docs' `sh` blocks, as tests/docs.rs checks them and tests/demo.rs runs
//! the README's tour.

/// The commands of a page's `sh` blocks: continuation lines joined, comments and a `$ `
/// prompt taken off; in a block that shows a prompt, only the prompted lines are commands.
pub fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut block: Option<Vec<&str>> = None;
    for line in text.lines() {
        match (&mut block, line.trim_start().strip_prefix("```")) {
            (None, Some("sh")) => block = Some(Vec::new()),
            (Some(lines), Some(_)) => {
                let prompted = lines.iter().any(|l| l.starts_with("$ "));
                let mut command = String::new();
                for l in lines.iter() {
                    let l = match (prompted, l.strip_prefix("$ ")) {
                        (true, None) if command.is_empty() => continue,
                        (_, Some(p)) => p,
                        (_, None) => l,
                    };
                    let l = l.split(" #").next().unwrap().trim();
                    if l.is_empty() || l.starts_with('#') {
                        continue;
                    }
                    match l.strip_suffix('\\') {
                        Some(head) => command.push_str(head),
                        None => {
                            command.push_str(l);
                            out.push(std::mem::take(&mut command));
                        }
                    }
                }
                block = None;
            }
            (Some(lines), None) => lines.push(line),
            _ => {}
        }
    }
    out
}
