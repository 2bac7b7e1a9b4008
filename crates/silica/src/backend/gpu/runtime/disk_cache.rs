//! The driver's compiled pipelines kept on disk between processes
//! (`<cache folder>/pipelines/`), so that a second process builds its
//! kernels from the driver's cache instead of compiling them again.
//!
//! wgpu's [`wgpu::PipelineCache`] holds the driver's data (Vulkan only).
//! silica wraps it in a header of its own: a key naming the adapter, the
//! driver and silica's version, the payload's length and its CRC-32. wgpu
//! checks the adapter but passes the payload to the driver unchecked, so a
//! file that fails any of these checks is ignored with a warning, never
//! handed to the driver.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const MAGIC: &[u8; 8] = b"SILICAPC";
const VERSION: u32 = 1;
/// A file larger than this is dropped and the cache started afresh:
/// drivers' caches only grow, and old kernels' entries are dead weight.
const MAX_BYTES: u64 = 256 << 20;

/// One device's pipeline cache and the file it is saved to.
pub(crate) struct DiskCache {
    pub cache: wgpu::PipelineCache,
    path: PathBuf,
    key: String,
    /// Pipelines were built since the last save.
    dirty: AtomicBool,
}

/// What identifies the adapter, its driver and silica's build: a cache
/// written under another key is never used.
pub(super) fn cache_key(info: &wgpu::AdapterInfo) -> String {
    format!(
        "silica {} | {:?} {:04x}:{:04x} {} | {} {}",
        env!("CARGO_PKG_VERSION"),
        info.backend,
        info.vendor,
        info.device,
        info.name,
        info.driver,
        info.driver_info,
    )
}

impl DiskCache {
    /// The cache for `device` under `dir`, with the saved data if a valid
    /// file is there; `None` where the backend keeps no application cache
    /// or the device does not have the feature.
    pub fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo, dir: &Path) -> Option<DiskCache> {
        if !device.features().contains(wgpu::Features::PIPELINE_CACHE) {
            return None;
        }
        let name = wgpu::util::pipeline_cache_key(info)?;
        let path = dir.join(format!("{name}.bin"));
        let key = cache_key(info);
        let data = read(&path, &key);
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        // SAFETY: `data` is what `PipelineCache::get_data` returned for an
        // adapter with the same key (the header checks it), byte for byte
        // (the CRC checks it).
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("silica pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            tracing::warn!("pipeline cache not used: {e}");
            return None;
        }
        tracing::debug!(
            target: "silica::pipelines",
            path = %path.display(),
            bytes = data.as_ref().map_or(0, Vec::len),
            "pipeline cache opened"
        );
        Some(DiskCache {
            cache,
            path,
            key,
            dirty: AtomicBool::new(false),
        })
    }

    /// Notes that a pipeline was built through the cache.
    pub fn touch(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Writes the cache if pipelines were built since it was last written:
    /// to a file of its own first, then renamed over the old one, so that
    /// processes saving at once never leave a torn file.
    pub fn save(&self) -> std::io::Result<bool> {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return Ok(false);
        }
        let Some(payload) = self.cache.get_data() else {
            return Ok(false);
        };
        let bytes = encode(&self.key, &payload);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        static SAVES: AtomicU64 = AtomicU64::new(0);
        let tmp = self.path.with_extension(format!(
            "{}.{}.tmp",
            std::process::id(),
            SAVES.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &self.path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
            self.dirty.store(true, Ordering::Relaxed);
        }
        written.map(|()| true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The payload of the file at `path` if it is a valid cache for `key`;
/// a missing file is silent, any other problem a warning.
fn read(path: &Path, key: &str) -> Option<Vec<u8>> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("pipeline cache {} not read: {e}", path.display());
            return None;
        }
    };
    if len > MAX_BYTES {
        tracing::warn!(
            "pipeline cache {} is {len} bytes; starting a new one",
            path.display()
        );
        return None;
    }
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("pipeline cache {} not read: {e}", path.display());
            return None;
        }
    };
    match decode(key, &bytes) {
        Ok(payload) => Some(payload.to_vec()),
        Err(why) => {
            tracing::warn!("pipeline cache {} ignored: {why}", path.display());
            None
        }
    }
}

/// `MAGIC`, version, key length and key, payload length, CRC-32 of the
/// payload, payload (integers little-endian).
fn encode(key: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + key.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of `bytes` if they are a whole cache file written for `key`.
fn decode<'a>(key: &str, bytes: &'a [u8]) -> Result<&'a [u8], &'static str> {
    fn take<'b>(b: &mut &'b [u8], n: usize) -> Result<&'b [u8], &'static str> {
        if b.len() < n {
            return Err("truncated");
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn u32_of(b: &mut &[u8]) -> Result<u32, &'static str> {
        let mut a = [0u8; 4];
        a.copy_from_slice(take(b, 4)?);
        Ok(u32::from_le_bytes(a))
    }
    let mut b = bytes;
    if take(&mut b, MAGIC.len())? != MAGIC {
        return Err("not a silica pipeline cache");
    }
    if u32_of(&mut b)? != VERSION {
        return Err("written by another version of silica");
    }
    let key_len = u32_of(&mut b)? as usize;
    if take(&mut b, key_len)? != key.as_bytes() {
        return Err("written for another adapter, driver or silica version");
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(take(&mut b, 8)?);
    let len = u64::from_le_bytes(len);
    let crc = u32_of(&mut b)?;
    if b.len() as u64 != len {
        return Err("truncated or extended");
    }
    if crc32fast::hash(b) != crc {
        return Err("corrupt (checksum mismatch)");
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_round_trips() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let bytes = encode("k", &payload);
        assert_eq!(decode("k", &bytes), Ok(&payload[..]));
        assert_eq!(decode("k", &encode("k", &[])), Ok(&[][..]));
    }

    #[test]
    fn bad_files_are_refused() {
        let payload = vec![5u8; 64];
        let good = encode("adapter A", &payload);
        assert!(decode("adapter B", &good).is_err(), "foreign key");
        for cut in [0, 3, 8, 20, good.len() - 1] {
            assert!(decode("adapter A", &good[..cut]).is_err(), "cut {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode("adapter A", &longer).is_err(), "extended");
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(
            decode("adapter A", &flipped),
            Err("corrupt (checksum mismatch)")
        );
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(
            decode("adapter A", &magic),
            Err("not a silica pipeline cache")
        );
        let mut version = good;
        version[8] = 9;
        assert_eq!(
            decode("adapter A", &version),
            Err("written by another version of silica")
        );
    }

    #[test]
    fn unreadable_or_invalid_files_give_no_data() {
        let dir = std::env::temp_dir().join(format!("silica-pc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.bin");
        assert_eq!(read(&path, "k"), None, "missing");
        std::fs::write(&path, b"garbage").unwrap();
        assert_eq!(read(&path, "k"), None, "garbage");
        std::fs::write(&path, encode("k", b"data")).unwrap();
        assert_eq!(read(&path, "k").as_deref(), Some(&b"data"[..]));
        assert_eq!(read(&path, "other"), None, "foreign");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
