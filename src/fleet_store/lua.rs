//! A Lua script of one of the rooms above, laid out as one command.

use redis::{Cmd, Script};

/// A Lua script of one of the rooms above. redis-rs's own `ScriptInvocation` cannot be put in
/// a pipeline (its command is private to the crate), so every call, alone or pipelined, is
/// laid out here: `EVALSHA sha numkeys KEYS… ARGV…`.
pub(crate) struct Lua {
    source: &'static str,
    script: Script,
}

impl Lua {
    /// A script from its source (a `.lua` file, `include_str!`-ed).
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            script: Script::new(source),
        }
    }

    /// The SHA-1 of the source, as Redis names a loaded script.
    pub(crate) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// A call with `keys`, as one command (for [`super::Client::call`], [`super::Client::query`] or a
    /// pipeline); its `ARGV` follow with `.arg(…)`.
    pub(crate) fn evalsha(&self, keys: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.hash()).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        cmd
    }

    /// `SCRIPT LOAD` of the source.
    pub(super) fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_laid_out_as_evalsha() {
        let lua = Lua::new("return 1");
        let mut cmd = lua.evalsha(&["k1", "k2"]);
        cmd.arg("a").arg(7u64);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<other>".into(),
            })
            .collect();
        assert_eq!(args, ["EVALSHA", lua.hash(), "2", "k1", "k2", "a", "7"]);
        assert_eq!(lua.hash().len(), 40);
    }
}
