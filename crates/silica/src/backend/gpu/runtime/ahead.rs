//! Kernels built ahead: the pipelines a previous process used for the same
//! work (a tool names it with a tag, such as a model file and dtype), kept
//! as a list beside the pipeline cache (`<cache folder>/pipelines/`) and
//! built again on a thread of their own while this process loads its
//! model. The first token then finds its kernels built instead of paying
//! a few ms for each (naga's translation and the driver's cache lookup)
//! on its own path (docs/tuning.md, "Kernels built ahead").
//!
//! A dispatch that needs a listed kernel before the thread reaches it
//! takes it off the list and builds it itself; one that needs the kernel
//! the thread is building waits for it. A list written for another
//! adapter, driver or silica version is ignored with a warning; a line
//! naming a kernel or constant this build does not have is skipped, and a
//! kernel that fails to build is left out (the dispatch that needs it
//! reports the error).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use super::pipelines::{Kernel, PipelineKey, PipelineQuery};
use super::{Context, lock};
use hashbrown::Equivalent;

const MAGIC: &str = "silica kernels 1";
/// Lines read from a list at most: a list only grows with the kernels of
/// one tag's work, so a longer file is not one silica wrote.
const MAX_ENTRIES: usize = 4096;

/// A pipeline to build: a kernel, its override constants and whether its
/// parameters are immediates.
pub(super) struct AheadEntry {
    pub kernel: &'static Kernel,
    pub constants: Vec<(&'static str, f64)>,
    pub immediates: bool,
}

impl AheadEntry {
    fn query(&self) -> PipelineQuery<'_> {
        PipelineQuery::new(self.kernel.name, &self.constants, self.immediates)
    }
}

/// The queue of the thread that builds kernels ahead.
#[derive(Default)]
pub(super) struct Ahead {
    state: Mutex<AheadState>,
    changed: Condvar,
}

#[derive(Default)]
struct AheadState {
    queue: VecDeque<AheadEntry>,
    /// The pipeline the thread is building.
    building: Option<PipelineKey>,
    /// The thread runs: entries left, one in hand, or its first read-back
    /// (see `GpuDevice::build_kernels_ahead`).
    running: bool,
    /// The list to write at the next save: the tag's file.
    list: Option<PathBuf>,
}

impl Ahead {
    /// Queues `entries` for the builder thread; false if a thread already
    /// runs (its queue is left as it is).
    pub fn start(&self, entries: Vec<AheadEntry>, list: PathBuf) -> bool {
        let mut s = lock(&self.state);
        s.list = Some(list);
        if s.running {
            return false;
        }
        s.queue = entries.into();
        s.running = true;
        true
    }

    /// The file the pipelines used are listed in at the next save.
    pub fn list(&self) -> Option<PathBuf> {
        lock(&self.state).list.clone()
    }

    /// Before a dispatch builds the pipeline of `query` itself: takes it
    /// off the queue, or waits while the thread builds it.
    pub fn claim(&self, query: &PipelineQuery) {
        let mut s = lock(&self.state);
        if !s.running {
            return;
        }
        s.queue.retain(|e| !e.query().same(query));
        while s.building.as_ref().is_some_and(|k| query.equivalent(k)) {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The thread's next entry (marked as being built), or `None` when the
    /// queue is empty.
    fn next(&self) -> Option<AheadEntry> {
        let mut s = lock(&self.state);
        s.building = None;
        let e = s.queue.pop_front();
        if let Some(e) = &e {
            s.building = Some(e.query().key());
        }
        drop(s);
        self.changed.notify_all();
        e
    }

    /// The thread is done.
    pub fn finish(&self) {
        lock(&self.state).running = false;
        self.changed.notify_all();
    }

    /// Empties the queue and waits for the pipeline in hand, if any.
    pub fn stop(&self) {
        let mut s = lock(&self.state);
        s.queue.clear();
        while s.running {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Drops the queue where no thread could be started to build it.
    pub fn abandon(&self) {
        lock(&self.state).queue.clear();
        self.finish();
    }

    /// Waits until the thread is done.
    pub fn wait(&self) {
        let mut s = lock(&self.state);
        while s.running {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Context {
    /// The builder thread's loop: every queued pipeline, in order.
    pub(crate) fn build_ahead(&self) {
        while let Some(e) = self.ahead.next() {
            if let Err(err) = self.build_pipeline(e.kernel, &e.constants, e.immediates, false) {
                tracing::debug!(
                    target: "silica::pipelines",
                    kernel = e.kernel.name,
                    "a kernel listed to build ahead failed: {err}"
                );
            }
        }
    }
}

/// The list of the tag `tag` on the adapter of cache key `key`, in `dir`.
pub(super) fn list_path(dir: &Path, key: &str, tag: &str) -> PathBuf {
    dir.join(format!(
        "kernels-{:08x}-{:08x}.txt",
        crc32fast::hash(key.as_bytes()),
        crc32fast::hash(tag.as_bytes())
    ))
}

/// The entries of the list at `path` if it was written for `key`, those
/// whose kernel is in `kernels` and whose constants it declares; a missing
/// file is silent, a foreign or unreadable one a warning.
pub(super) fn read_list(path: &Path, key: &str, kernels: &[&'static Kernel]) -> Vec<AheadEntry> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!("kernel list {} not read: {e}", path.display());
            return Vec::new();
        }
    };
    match parse_list(&text, key, kernels) {
        Ok(entries) => entries,
        Err(why) => {
            tracing::warn!("kernel list {} ignored: {why}", path.display());
            Vec::new()
        }
    }
}

fn parse_list(
    text: &str,
    key: &str,
    kernels: &[&'static Kernel],
) -> Result<Vec<AheadEntry>, &'static str> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not a silica kernel list");
    }
    if lines.next() != Some(key) {
        return Err("written for another adapter, driver or silica version");
    }
    let mut out = Vec::new();
    for line in lines.take(MAX_ENTRIES) {
        match parse_entry(line, kernels) {
            Some(e) => out.push(e),
            None => tracing::debug!(
                target: "silica::pipelines",
                "kernel list line skipped: {line}"
            ),
        }
    }
    Ok(out)
}

/// `name immediates(0|1) constants`, the constants `-` or `NAME=bits` (the
/// f64's bits in hex) joined by commas.
fn parse_entry(line: &str, kernels: &[&'static Kernel]) -> Option<AheadEntry> {
    let mut parts = line.split(' ');
    let (name, imm, consts) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let kernel = *kernels.iter().find(|k| k.name == name)?;
    let immediates = match imm {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    let mut constants = Vec::new();
    if consts != "-" {
        for c in consts.split(',') {
            let (n, bits) = c.split_once('=')?;
            let bits = u64::from_str_radix(bits, 16).ok()?;
            constants.push((declared_constant(kernel, n)?, f64::from_bits(bits)));
        }
    }
    Some(AheadEntry {
        kernel,
        constants,
        immediates,
    })
}

/// `name` as the kernel's source spells it in an `override` declaration
/// (a `'static` string, as pipeline keys hold them), if it declares one.
fn declared_constant(kernel: &'static Kernel, name: &str) -> Option<&'static str> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let decl = format!("override {name}:");
    let at = kernel.source.find(&decl)? + "override ".len();
    Some(&kernel.source[at..at + name.len()])
}

/// Writes the list of `entries` (name, constants as bits, immediates) for
/// `key` to `path`, through a file of its own renamed over the old one.
pub(super) fn write_list<'a>(
    path: &Path,
    key: &str,
    entries: impl Iterator<Item = (&'a str, &'a [(&'static str, u64)], bool)>,
) -> std::io::Result<()> {
    let mut text = format!("{MAGIC}\n{key}\n");
    for (name, constants, immediates) in entries {
        let consts = if constants.is_empty() {
            "-".to_string()
        } else {
            let c: Vec<String> = constants
                .iter()
                .map(|(n, b)| format!("{n}={b:x}"))
                .collect();
            c.join(",")
        };
        text.push_str(&format!("{name} {} {consts}\n", immediates as u8));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::KernelNeeds;

    static K: Kernel = Kernel {
        name: "k",
        source: "override OUT_DT: u32 = 0u;\noverride FMT: u32 = 1u;\n",
        inputs: 1,
        outputs: 1,
        trusted: false,
        immediates: true,
        needs: KernelNeeds::NOTHING,
    };

    #[test]
    fn a_list_round_trips() {
        let dir = std::env::temp_dir().join(format!("silica-kl-{}", std::process::id()));
        let path = list_path(&dir, "adapter", "model f16");
        let consts: Vec<(&'static str, u64)> =
            vec![("OUT_DT", 1f64.to_bits()), ("FMT", 2f64.to_bits())];
        let entries = [("k", &consts[..], true), ("k", &[][..], false)];
        write_list(&path, "adapter", entries.into_iter()).unwrap();
        let got = read_list(&path, "adapter", &[&K]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].constants, vec![("OUT_DT", 1.0), ("FMT", 2.0)]);
        assert!(got[0].immediates);
        assert!(got[1].constants.is_empty() && !got[1].immediates);
        assert!(
            read_list(&path, "another adapter", &[&K]).is_empty(),
            "foreign key"
        );
        assert!(
            read_list(&path, "adapter", &[]).is_empty(),
            "unknown kernel"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_lines_are_skipped_and_bad_files_refused() {
        let key = "adapter";
        let text = format!(
            "{MAGIC}\n{key}\nk 1 OUT_DT=3ff0000000000000\nk 1 NOPE=0\nk 2 -\nk 1 OUT_DT=zz\nother 0 -\nk 0 -\n\nk 0 - extra\nk 0 OUT_DT\n"
        );
        let got = parse_list(&text, key, &[&K]).unwrap();
        assert_eq!(got.len(), 2, "the first and the sixth lines");
        assert_eq!(got[0].constants, vec![("OUT_DT", 1.0)]);
        assert!(parse_list("garbage", key, &[&K]).is_err());
        assert!(parse_list(&format!("{MAGIC}\nother\n"), key, &[&K]).is_err());
        // a constant is matched against the source's declarations only
        assert_eq!(declared_constant(&K, "OUT_D"), None);
        assert_eq!(declared_constant(&K, "u32"), None);
        assert_eq!(declared_constant(&K, "FMT"), Some("FMT"));
    }
}
