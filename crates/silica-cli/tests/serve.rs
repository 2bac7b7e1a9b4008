//! `silica serve` as a process on a loopback port: the official `openai`
//! Python client against it on the CPU and on every GPU adapter
//! (tests/serve_openai.py), the error cases over raw HTTP (OpenAI's error
//! shape, 400/401/404/429), 32 concurrent streaming clients, some leaving
//! mid-stream, a SIGTERM that lets a stream in flight finish, and prompts
//! that reuse an earlier request's KV cache.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running server, killed on drop.
struct Server {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `silica serve` on a free port with `args` and waits until
    /// `/health` says ready.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_silica"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .env_remove("SILICA_DEVICE")
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the silica binary runs");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut port = None;
        let log = Arc::new(Mutex::new(Vec::new()));
        for line in lines.by_ref() {
            let line = line.unwrap();
            log.lock().unwrap().push(line.clone());
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                port = rest.split_whitespace().next().and_then(|p| p.parse().ok());
                break;
            }
        }
        let port = port.unwrap_or_else(|| panic!("no port in {:?}", log.lock().unwrap()));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        let server = Server { child, port, log };
        let start = Instant::now();
        loop {
            if let Ok(r) = server.request("GET", "/health", &[], "")
                && r.status == 200
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "not ready: {:?}",
                server.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[&str],
        body: &str,
    ) -> std::io::Result<Reply> {
        request_at(self.port, method, path, headers, body)
    }

    fn post(&self, path: &str, body: &str) -> Reply {
        self.request("POST", path, &[], body).unwrap()
    }

    fn metric(&self, name: &str) -> f64 {
        let r = self.request("GET", "/metrics", &[], "").unwrap();
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// A POST to the server on `port`, from any thread.
fn post(port: u16, path: &str, body: &str) -> Reply {
    request_at(port, "POST", path, &[], body).unwrap()
}

/// One HTTP/1.1 request to the server on `port`, read to the end.
fn request_at(
    port: u16,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(Reply::parse(&raw))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

impl Reply {
    fn parse(raw: &[u8]) -> Reply {
        let text = String::from_utf8_lossy(raw);
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest.as_bytes())
        } else {
            rest.to_string()
        };
        Reply {
            status,
            headers: head.to_string(),
            body,
        }
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of a server-sent event stream.
    fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// The body of a chunked transfer (as much as arrived).
fn dechunk(mut b: &[u8]) -> String {
    let mut out = Vec::new();
    while let Some(end) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = end + 2;
        let stop = (start + size).min(b.len());
        out.extend_from_slice(&b[start..stop]);
        b = &b[(stop + 2).min(b.len())..];
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Asserts an error in OpenAI's shape with `status`, whose message has `want`.
fn check_error(r: &Reply, status: u16, want: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", r.body));
    assert!(msg.contains(want), "{msg:?} does not contain {want:?}");
    assert!(v["error"]["type"].is_string(), "{}", r.body);
}

fn python_has_openai() {
    let ok = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the serve tests need Python's openai package (pip install openai; .ci/run installs it)"
    );
}

fn run_openai_client(server: &Server) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_openai.py");
    let out = Command::new("python3")
        .args([script, &server.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client:\n{}\n{}\nserver log: {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.log.lock().unwrap()
    );
}

#[test]
fn the_openai_client_works_on_the_cpu() {
    python_has_openai();
    let server = Server::start(&["--device", "cpu", "--parallel", "4"]);
    run_openai_client(&server);
    let m = server.request("GET", "/metrics", &[], "").unwrap();
    assert!(
        m.body
            .contains("silica_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2"),
        "{}",
        m.body
    );
    assert!(
        m.body.contains("silica_time_to_first_token_seconds_count"),
        "{}",
        m.body
    );
}

#[test]
fn the_openai_client_works_on_every_gpu() {
    python_has_openai();
    let n = silica::adapters().len();
    if n == 0 {
        assert!(
            std::env::var("SILICA_REQUIRE_GPU").as_deref() != Ok("1"),
            "SILICA_REQUIRE_GPU=1 but no GPU adapter"
        );
        return;
    }
    for i in 0..n {
        let dev = format!("gpu:{i}");
        let server = Server::start(&["--device", &dev, "--parallel", "4"]);
        // the steps' kernels were built before the server said it was
        // ready: prompts and 1 to 4 sequences at once build none
        let built = server.metric("silica_kernels_built_total");
        assert!(built > 0.0, "{dev}: no kernel built before ready");
        // the answers make sense after the kernels were built ahead (whose
        // steps once left the KV pool's RoPE tables undefined): the model
        // counts on, greedily
        let r = server.post(
            "/v1/completions",
            r#"{"prompt":"1, 2, 3, 4, 5, 6, 7, 8, 9, 10,","max_tokens":8,"temperature":0}"#,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert!(text.starts_with(" 11, 12"), "{dev}: {text:?}");
        let port = server.port;
        let clients: Vec<_> = (0..3)
            .map(|_| std::thread::spawn(move || stream_chat(port, 6, None).is_some()))
            .collect();
        for c in clients {
            assert!(c.join().unwrap(), "{dev}: a stream did not complete");
        }
        assert!(stream_chat(port, 3, None).is_some());
        assert_eq!(
            server.metric("silica_kernels_built_total"),
            built,
            "{dev}: a step built a kernel after ready"
        );
        run_openai_client(&server);
        // penalties picked on the device, alone and with other sequences
        // (whose steps are queued on their picks, in flight when counted)
        let penalized = |port: u16, t: f32| {
            let body = format!(
                r#"{{"prompt":"one two one two one two","max_tokens":8,"temperature":{t},"seed":5,"repetition_penalty":1.3,"frequency_penalty":0.5,"presence_penalty":0.25}}"#
            );
            let r = post(port, "/v1/completions", &body);
            assert_eq!(r.status, 200, "{}", r.body);
            let usage = &r.json()["usage"];
            let done = r.json()["choices"][0]["finish_reason"].as_str() == Some("stop");
            assert!(
                done || usage["completion_tokens"].as_u64() == Some(8),
                "{}",
                r.body
            );
        };
        penalized(port, 0.0);
        let clients: Vec<_> = [0.0f32, 0.8, 0.0, 0.8]
            .into_iter()
            .map(|t| std::thread::spawn(move || penalized(port, t)))
            .collect();
        for c in clients {
            c.join().unwrap();
        }
    }
}

/// A GPU server in f16 with the weights' decoded copies kept from 9 rows
/// (`--keep-decoded`): its prompts' products multiply the copies, and the
/// model still counts on, alone and beside other sequences.
#[test]
fn a_gpu_server_with_kept_decoded_weights_counts_on() {
    for i in 0..silica::adapters().len() {
        let dev = format!("gpu:{i}");
        let server = Server::start(&[
            "--device",
            &dev,
            "--parallel",
            "4",
            "--dtype",
            "f16",
            "--keep-decoded",
            "9",
        ]);
        let port = server.port;
        let count = move || {
            let r = post(
                port,
                "/v1/completions",
                r#"{"prompt":"1, 2, 3, 4, 5, 6, 7, 8, 9, 10,","max_tokens":8,"temperature":0}"#,
            );
            assert_eq!(r.status, 200, "{}", r.body);
            r.json()["choices"][0]["text"].as_str().unwrap().to_string()
        };
        let text = count();
        assert!(text.starts_with(" 11, 12"), "{dev}: {text:?}");
        let clients: Vec<_> = (0..3).map(|_| std::thread::spawn(count)).collect();
        for c in clients {
            assert_eq!(c.join().unwrap(), text, "{dev}");
        }
    }
}

/// One non-streamed completion of 6 greedy tokens: the usage's prompt
/// tokens and cached prompt tokens.
fn complete_cached(server: &Server, prompt: &str) -> (u64, u64) {
    let body = format!(r#"{{"prompt":"{prompt}","max_tokens":6,"temperature":0}}"#);
    let r = server.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let u = &r.json()["usage"];
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64();
    (u["prompt_tokens"].as_u64().unwrap(), cached.unwrap())
}

/// A prompt that starts as a finished request's did computes only the rest
/// (usage's cached tokens and /metrics' counter), a prompt sharing little
/// takes the slot freed longest ago instead of that cache, and
/// `--no-prompt-cache` computes every prompt whole.
#[test]
fn a_repeated_prompt_reuses_the_kv_cache() {
    let p = "The history of the river begins in the mountains, where";
    // q shares its first words with p, a small part of p's kept tokens
    let q = "The history of Rome is long and";
    let args = [
        "--device",
        "cpu",
        "--parallel",
        "2",
        "--embed-model",
        "none",
    ];
    let server = Server::start(&args);
    let (n, cached) = complete_cached(&server, p);
    assert_eq!(cached, 0, "nothing was kept yet");
    assert!(n > 4);
    // everything but the last token, whose logits give the first new one
    assert_eq!(complete_cached(&server, p), (n, n - 1));
    assert_eq!(complete_cached(&server, q).1, 0, "q took p's cache");
    assert_eq!(
        complete_cached(&server, p),
        (n, n - 1),
        "p's cache was lost"
    );
    assert_eq!(
        server.metric("silica_prompt_tokens_cached_total"),
        (2 * (n - 1)) as f64
    );
    // a chat's second turn starts with the first turn's prompt (and, as
    // the template writes it back, the reply)
    let first = r#"[{"role":"user","content":"Name a river."}]"#;
    let r = server.post(
        "/v1/chat/completions",
        &format!(r#"{{"messages":{first},"max_tokens":6,"temperature":0}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let turn1 = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let reply = v["choices"][0]["message"]["content"].as_str().unwrap();
    let second = serde_json::json!({
        "messages": [
            {"role": "user", "content": "Name a river."},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And a mountain?"},
        ],
        "max_tokens": 6,
        "temperature": 0,
    });
    let r = server.post("/v1/chat/completions", &second.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let u = &r.json()["usage"];
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= turn1 && cached < u["prompt_tokens"].as_u64().unwrap(),
        "turn 2 reused {cached} tokens of a first turn of {turn1}: {u}"
    );
    drop(server);
    let server = Server::start(&[&args[..], &["--no-prompt-cache"]].concat());
    assert_eq!(complete_cached(&server, p), (n, 0));
    assert_eq!(complete_cached(&server, p), (n, 0));
    assert_eq!(server.metric("silica_prompt_tokens_cached_total"), 0.0);
}

#[test]
fn bad_requests_get_openai_errors() {
    let server = Server::start(&["--device", "cpu", "--ctx", "64", "--embed-model", "none"]);
    let chat = |extra: &str| format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
    check_error(
        &server.post("/v1/chat/completions", "{not json"),
        400,
        "not valid JSON",
    );
    check_error(
        &server.post("/v1/chat/completions", &chat(r#","max_tokens":"many""#)),
        400,
        "does not fit",
    );
    check_error(
        &server.post("/v1/chat/completions", &chat(r#","max_tokens":0"#)),
        400,
        "max_tokens",
    );
    check_error(
        &server.post("/v1/chat/completions", &chat(r#","model":"gpt-9""#)),
        400,
        "gpt-9",
    );
    check_error(
        &server.post("/v1/chat/completions", &chat(r#","n":2"#)),
        400,
        "n = 1",
    );
    check_error(
        &server.post("/v1/chat/completions", &chat(r#","temperature":5"#)),
        400,
        "temperature",
    );
    check_error(
        &server.post("/v1/chat/completions", &chat(r#","frequency_penalty":2.5"#)),
        400,
        "frequency_penalty",
    );
    check_error(
        &server.post(
            "/v1/completions",
            r#"{"prompt":"Hi","presence_penalty":-3}"#,
        ),
        400,
        "presence_penalty",
    );
    check_error(
        &server.post("/v1/chat/completions", r#"{"messages":[]}"#),
        400,
        "empty",
    );
    let long = "word ".repeat(200);
    check_error(
        &server.post("/v1/completions", &format!(r#"{{"prompt":"{long}"}}"#)),
        400,
        "context",
    );
    check_error(
        &server.post("/v1/embeddings", r#"{"input":"hi"}"#),
        400,
        "no embedding model",
    );
    check_error(&server.post("/v1/nothing", "{}"), 404, "no such endpoint");
    // unknown fields are ignored, as OpenAI's own clients send some
    let r = server.post(
        "/v1/completions",
        r#"{"prompt":"Hi","max_tokens":2,"temperature":0,"logit_bias":{},"user":"u"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() <= 2);
    // OpenAI's penalties are taken (applied by the host sampler on the CPU)
    let r = server.post(
        "/v1/completions",
        r#"{"prompt":"Hi","max_tokens":2,"temperature":0,"frequency_penalty":0.5,"presence_penalty":0.5}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    let keyed = Server::start(&[
        "--device",
        "cpu",
        "--api-key",
        "sekret",
        "--embed-model",
        "none",
    ]);
    let body = r#"{"prompt":"Hi","max_tokens":1}"#;
    check_error(
        &keyed.request("POST", "/v1/completions", &[], body).unwrap(),
        401,
        "API key",
    );
    check_error(
        &keyed
            .request(
                "POST",
                "/v1/completions",
                &["Authorization: Bearer wrong"],
                body,
            )
            .unwrap(),
        401,
        "API key",
    );
    let r = keyed
        .request(
            "POST",
            "/v1/completions",
            &["Authorization: Bearer sekret"],
            body,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // health needs no key
    assert_eq!(
        keyed.request("GET", "/health", &[], "").unwrap().status,
        200
    );
}

#[test]
fn a_full_queue_answers_429() {
    let server = Server::start(&[
        "--device",
        "cpu",
        "--parallel",
        "1",
        "--queue",
        "1",
        "--embed-model",
        "none",
    ]);
    let long = r#"{"prompt":"Count: 1, 2, 3,","max_tokens":400,"temperature":0,"stream":true}"#;
    let port = server.port;
    let mut held = Vec::new();
    for _ in 0..2 {
        // a streaming request that stays open: one active, one queued
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: l\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}",
            long.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        held.push(s);
        std::thread::sleep(Duration::from_millis(300));
    }
    let start = Instant::now();
    while server.metric("silica_queue_depth") < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the second request never queued"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = server.post("/v1/completions", r#"{"prompt":"Hi","max_tokens":1}"#);
    check_error(&r, 429, "queue is full");
    assert!(
        r.headers.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        r.headers
    );
    drop(held);
    // the clients left: their sequences are freed
    let start = Instant::now();
    while server.metric("silica_active_sequences") > 0.0
        || server.metric("silica_queue_depth") > 0.0
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "sequences of gone clients kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One streaming client request; with `leave_after` bytes it disconnects
/// once that much has arrived. Returns the reply when it read to the end.
fn stream_chat(port: u16, max_tokens: usize, leave_after: Option<usize>) -> Option<Reply> {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Tell me about rivers."}}],"max_tokens":{max_tokens},"temperature":0.7,"stream":true,"stream_options":{{"include_usage":true}}}}"#
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: l\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return Some(Reply::parse(&raw));
        }
        raw.extend_from_slice(&buf[..n]);
        if leave_after.is_some_and(|k| raw.len() >= k) {
            return None;
        }
    }
}

#[test]
fn many_concurrent_streams_complete_and_leavers_are_freed() {
    let secs: u64 = std::env::var("SILICA_SERVE_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let server = Server::start(&[
        "--device",
        "cpu",
        "--parallel",
        "32",
        "--embed-model",
        "none",
    ]);
    // one request first, so that the idle level includes what stays allocated
    assert!(stream_chat(server.port, 4, None).is_some());
    let idle = server.metric("silica_device_memory_allocated_bytes");
    let (complete, left) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..32u64)
        .map(|c| {
            let (port, complete, left) = (server.port, complete.clone(), left.clone());
            std::thread::spawn(move || {
                let mut k = c * 7919 + 1;
                while Instant::now() < deadline {
                    k = k
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let max_tokens = 4 + (k >> 33) as usize % 40;
                    let leave = ((k >> 20) % 4 == 0).then(|| 200 + (k >> 40) as usize % 1500);
                    match stream_chat(port, max_tokens, leave) {
                        None => {
                            left.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(r) => {
                            assert_eq!(r.status, 200, "{}", r.body);
                            let events = r.events();
                            assert_eq!(
                                events.last().map(String::as_str),
                                Some("[DONE]"),
                                "{}",
                                r.body
                            );
                            let chunks: Vec<Value> = events[..events.len() - 1]
                                .iter()
                                .map(|e| serde_json::from_str(e).unwrap())
                                .collect();
                            let finishes = chunks
                                .iter()
                                .filter(|c| c["choices"][0]["finish_reason"].is_string())
                                .count();
                            assert_eq!(finishes, 1, "{}", r.body);
                            let usage = &chunks.last().unwrap()["usage"];
                            let n = usage["completion_tokens"].as_u64().unwrap() as usize;
                            assert!(n <= max_tokens, "{}", r.body);
                            complete.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (complete, left) = (
        complete.load(Ordering::Relaxed),
        left.load(Ordering::Relaxed),
    );
    eprintln!("{secs} s of 32 streaming clients: {complete} complete, {left} left mid-stream");
    assert!(
        complete >= 32 && left >= 1,
        "{complete} complete, {left} left"
    );
    let start = Instant::now();
    while server.metric("silica_active_sequences") > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "sequences still active"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = server.metric("silica_device_memory_allocated_bytes");
    assert!(
        after <= idle,
        "device memory {after} bytes after the load, {idle} idle"
    );
    let served = server.metric("silica_completion_tokens_total");
    assert!(served > 0.0);
}

#[test]
fn sigterm_lets_a_stream_in_flight_finish() {
    let mut server = Server::start(&["--device", "cpu", "--embed-model", "none", "--grace", "60"]);
    let port = server.port;
    let client = std::thread::spawn(move || stream_chat(port, 48, None));
    // wait until it streams, then ask the server to stop
    let start = Instant::now();
    while server.metric("silica_active_sequences") < 1.0 {
        assert!(start.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let r = client.join().unwrap().expect("the stream completed");
    assert_eq!(
        r.events().last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{:?}", server.log.lock().unwrap());
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still accepting"
    );
}
