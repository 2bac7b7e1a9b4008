//! The counters `GET /metrics` reports, in Prometheus' text format.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds (seconds) of the time-to-first-token histogram.
const TTFT_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

pub struct Metrics {
    /// (endpoint, status) → count
    requests: Mutex<Vec<((&'static str, u16), u64)>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    embedded_inputs: AtomicU64,
    queued: AtomicU64,
    active: AtomicU64,
    steps: AtomicU64,
    step_tokens: AtomicU64,
    step_nanos: AtomicU64,
    ttft: Mutex<([u64; TTFT_BUCKETS.len()], u64, f64)>,
    /// tokens generated in the last full second, and the second's start
    rate: Mutex<(Instant, u64, f64)>,
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::default(),
            cached_tokens: AtomicU64::default(),
            completion_tokens: AtomicU64::default(),
            embedded_inputs: AtomicU64::default(),
            queued: AtomicU64::default(),
            active: AtomicU64::default(),
            steps: AtomicU64::default(),
            step_tokens: AtomicU64::default(),
            step_nanos: AtomicU64::default(),
            ttft: Mutex::new(([0; TTFT_BUCKETS.len()], 0, 0.0)),
            rate: Mutex::new((Instant::now(), 0, 0.0)),
        }
    }

    pub fn request(&self, endpoint: &'static str, status: u16) {
        let mut r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        match r.iter_mut().find(|(k, _)| *k == (endpoint, status)) {
            Some((_, n)) => *n += 1,
            None => r.push(((endpoint, status), 1)),
        }
    }

    pub fn prompt(&self, tokens: usize) {
        self.prompt_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Prompt tokens whose positions a sequence took from a slot's last
    /// sequence instead of computing them.
    pub fn cached(&self, tokens: usize) {
        self.cached_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub fn embedded(&self, inputs: usize) {
        self.embedded_inputs
            .fetch_add(inputs as u64, Ordering::Relaxed);
    }

    pub fn generated(&self, tokens: usize) {
        self.completion_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        let mut r = self.rate.lock().unwrap_or_else(|e| e.into_inner());
        r.1 += tokens as u64;
        let elapsed = r.0.elapsed().as_secs_f64();
        if elapsed >= 1.0 {
            r.2 = r.1 as f64 / elapsed;
            *r = (Instant::now(), 0, r.2);
        }
    }

    pub fn set_load(&self, queued: usize, active: usize) {
        self.queued.store(queued as u64, Ordering::Relaxed);
        self.active.store(active as u64, Ordering::Relaxed);
    }

    pub fn step(&self, tokens: usize, time: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        self.step_nanos
            .fetch_add(time.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn first_token(&self, after: Duration) {
        let s = after.as_secs_f64();
        let mut h = self.ttft.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &b) in TTFT_BUCKETS.iter().enumerate() {
            if s <= b {
                h.0[i] += 1;
            }
        }
        h.1 += 1;
        h.2 += s;
    }

    /// The Prometheus text, with the device's memory figures and the
    /// kernels it has built (count and time, see `Device::pipeline_builds`).
    pub fn render(
        &self,
        memory: &silica::MemoryStats,
        kernels: (u64, std::time::Duration),
    ) -> String {
        let mut o = String::new();
        let g = |o: &mut String, name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        let _ = writeln!(
            o,
            "# HELP silica_requests_total HTTP requests by endpoint and status.\n# TYPE silica_requests_total counter"
        );
        for ((endpoint, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                o,
                "silica_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        g(
            &mut o,
            "silica_prompt_tokens_total",
            "counter",
            "Prompt tokens of generation requests.",
            load(&self.prompt_tokens),
        );
        g(
            &mut o,
            "silica_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from the KV cache of an earlier request.",
            load(&self.cached_tokens),
        );
        g(
            &mut o,
            "silica_completion_tokens_total",
            "counter",
            "Tokens generated.",
            load(&self.completion_tokens),
        );
        g(
            &mut o,
            "silica_embedding_inputs_total",
            "counter",
            "Texts embedded.",
            load(&self.embedded_inputs),
        );
        g(
            &mut o,
            "silica_queue_depth",
            "gauge",
            "Requests waiting for a sequence slot.",
            load(&self.queued),
        );
        g(
            &mut o,
            "silica_active_sequences",
            "gauge",
            "Sequences being generated.",
            load(&self.active),
        );
        g(
            &mut o,
            "silica_steps_total",
            "counter",
            "Batched forward passes.",
            load(&self.steps),
        );
        g(
            &mut o,
            "silica_step_tokens_total",
            "counter",
            "Tokens fed through batched forward passes.",
            load(&self.step_tokens),
        );
        g(
            &mut o,
            "silica_step_seconds_total",
            "counter",
            "Time in batched forward passes.",
            format!(
                "{:.6}",
                self.step_nanos.load(Ordering::Relaxed) as f64 / 1e9
            ),
        );
        let rate = self.rate.lock().unwrap_or_else(|e| e.into_inner()).2;
        g(
            &mut o,
            "silica_generation_tokens_per_second",
            "gauge",
            "Tokens generated per second, over the last second with output.",
            format!("{rate:.1}"),
        );
        let h = self.ttft.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            o,
            "# HELP silica_time_to_first_token_seconds From a request's arrival to its first token.\n# TYPE silica_time_to_first_token_seconds histogram"
        );
        for (i, b) in TTFT_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                o,
                "silica_time_to_first_token_seconds_bucket{{le=\"{b}\"}} {}",
                h.0[i]
            );
        }
        let _ = writeln!(
            o,
            "silica_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}",
            h.1
        );
        let _ = writeln!(o, "silica_time_to_first_token_seconds_sum {:.6}", h.2);
        let _ = writeln!(o, "silica_time_to_first_token_seconds_count {}", h.1);
        g(
            &mut o,
            "silica_device_memory_allocated_bytes",
            "gauge",
            "Device memory held by live tensors.",
            memory.allocated.to_string(),
        );
        g(
            &mut o,
            "silica_device_memory_reserved_bytes",
            "gauge",
            "Device memory silica holds (allocated plus cached).",
            memory.reserved.to_string(),
        );
        g(
            &mut o,
            "silica_device_memory_peak_bytes",
            "gauge",
            "The largest allocated figure so far.",
            memory.peak_allocated.to_string(),
        );
        g(
            &mut o,
            "silica_kernels_built_total",
            "counter",
            "GPU kernels (pipelines) built since the start; the model's steps are built before the server is ready.",
            kernels.0.to_string(),
        );
        g(
            &mut o,
            "silica_kernel_build_seconds_total",
            "counter",
            "Time spent building them.",
            format!("{:.6}", kernels.1.as_secs_f64()),
        );
        o
    }
}
