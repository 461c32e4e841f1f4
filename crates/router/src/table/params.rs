//! The parameters a pattern captured (`:name`, `*name`), as `uri_param_*` reads them.

/// Captured parameters; up to four are stored inline (no heap allocation).
#[derive(Clone, Debug)]
pub struct Params<'a> {
    inline: [(&'a str, &'a str); 4],
    len: usize,
    spill: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    pub(crate) fn new() -> Params<'a> {
        Params {
            inline: [("", ""); 4],
            len: 0,
            spill: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, name: &'a str, value: &'a str) {
        if self.len < self.inline.len() {
            self.inline[self.len] = (name, value);
        } else {
            self.spill.push((name, value));
        }
        self.len += 1;
    }

    fn all(&self) -> impl DoubleEndedIterator<Item = (&'a str, &'a str)> + '_ {
        self.inline[..self.len.min(4)]
            .iter()
            .chain(self.spill.iter())
            .copied()
    }

    /// The value of a parameter. A name captured twice keeps its last value, as the Lua table
    /// APISIX fills does.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.all().rev().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Each captured name once, with its final value, in capture order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        self.all()
            .enumerate()
            .filter(move |&(i, (n, _))| !self.all().skip(i + 1).any(|(m, _)| m == n))
            .map(|(_, p)| p)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for Params<'_> {
    fn default() -> Self {
        Params::new()
    }
}
