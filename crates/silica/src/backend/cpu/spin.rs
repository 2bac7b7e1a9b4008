//! A fork-join pool for the decode step's products, whose workers spin
//! for a while between jobs instead of sleeping at once.
//!
//! A decode step runs a few hundred products of a few hundred µs or less,
//! with short serial work (norms, attention) between them. rayon's workers
//! go to sleep in those gaps, and waking them costs a system call and a
//! reschedule per product: about a sixth of a small model's decode time on
//! 2 cores. These workers spin for [`SPIN`] after each job (then park), so
//! that the next product finds them awake, as llama.cpp's threads do.
//!
//! One job at a time: a caller that finds the pool busy (another thread's
//! product) gets `false` and uses rayon instead.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a worker waits for the next job before parking.
const SPIN: Duration = Duration::from_micros(300);

/// One job: `tasks` calls of `f`, taken by index.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    tasks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
}

impl Job<'_> {
    /// Runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.tasks {
                return;
            }
            let f = self.f;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
}

struct Shared {
    /// `epoch << 1 | open`: a new epoch publishes a job, `open` says that
    /// `job` may still be read.
    state: AtomicU64,
    /// The current job, type-erased (it lives on the caller's stack while
    /// `state` is open and workers are in flight).
    job: AtomicUsize,
    /// Workers that may be reading the job.
    in_flight: AtomicUsize,
    /// Workers parked (to be unparked by the next job).
    sleepers: AtomicUsize,
    busy: AtomicBool,
}

struct Pool {
    shared: Arc<Shared>,
    workers: Vec<Thread>,
}

fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let extra = rayon::current_num_threads().saturating_sub(1);
        if extra == 0 {
            return None;
        }
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(extra);
        for i in 0..extra {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("silica-spin-{i}"))
                .spawn(move || worker(&s))
                .ok()?;
            workers.push(h.thread().clone());
        }
        Some(Pool { shared, workers })
    })
    .as_ref()
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // wait for a new epoch: spin, then park
        let start = Instant::now();
        let mut spins = 0u32;
        let state = loop {
            let st = s.state.load(SeqCst);
            if st >> 1 != seen {
                break st;
            }
            spins = spins.wrapping_add(1);
            // the clock is read once per 64 turns
            if !spins.is_multiple_of(64) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            s.sleepers.fetch_add(1, SeqCst);
            // a job published after the load above unparks this thread
            if s.state.load(SeqCst) >> 1 == seen {
                std::thread::park();
            }
            s.sleepers.fetch_sub(1, SeqCst);
        };
        seen = state >> 1;
        if state & 1 == 0 {
            continue;
        }
        s.in_flight.fetch_add(1, SeqCst);
        // the job is still the one of this epoch and still open: read it
        if s.state.load(SeqCst) == state {
            let job = s.job.load(SeqCst) as *const Job<'_>;
            // SAFETY: the caller keeps the job alive until the state is
            // closed and no worker is in flight, and this worker counted
            // itself in flight before seeing the state open
            unsafe { (*job).work() };
        }
        s.in_flight.fetch_sub(1, SeqCst);
    }
}

/// Runs `f(0..tasks)` on this thread and the pool's workers; `false`
/// (nothing run) where there is no pool or it is busy.
pub(super) fn run(tasks: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
    let Some(p) = pool() else {
        return false;
    };
    let s = &*p.shared;
    if s.busy
        .compare_exchange(false, true, SeqCst, SeqCst)
        .is_err()
    {
        return false;
    }
    let job = Job {
        f,
        tasks,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    };
    s.job.store(&job as *const Job<'_> as usize, SeqCst);
    let epoch = (s.state.load(SeqCst) >> 1) + 1;
    s.state.store(epoch << 1 | 1, SeqCst);
    if s.sleepers.load(SeqCst) > 0 {
        for t in &p.workers {
            t.unpark();
        }
    }
    job.work();
    while job.done.load(SeqCst) < tasks {
        std::hint::spin_loop();
    }
    // close the job, then wait for the workers still reading it
    s.state.store(epoch << 1, SeqCst);
    while s.in_flight.load(SeqCst) > 0 {
        std::hint::spin_loop();
    }
    s.busy.store(false, SeqCst);
    if job.panicked.load(SeqCst) {
        panic!("a task of a CPU product panicked");
    }
    true
}

/// `f(i, chunk)` for the chunks of `out` of `chunk` elements (the last one
/// shorter), on the spinning pool where it is free, else through rayon.
pub(super) fn for_each_chunk<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    use rayon::prelude::*;
    let chunk = chunk.max(1);
    let n = out.len().div_ceil(chunk);
    if n > 1 {
        let len = out.len();
        let base = SendPtr(out.as_mut_ptr());
        let task = |i: usize| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            let base = &base;
            // SAFETY: the tasks' ranges are disjoint and inside `out`,
            // which stays borrowed until `run` returns
            let part = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
            f(i, part);
        };
        if run(n, &task) {
            return;
        }
    }
    if rayon::current_num_threads() <= 1 {
        // one thread: handing the job to rayon's only worker and waiting
        // for it costs a wake-up per product
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
        return;
    }
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(i, c)| f(i, c));
}

struct SendPtr<T>(*mut T);
// SAFETY: only used to hand disjoint ranges of one slice to the tasks
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_written_once() {
        for len in [0usize, 1, 7, 64, 1000] {
            for chunk in [1usize, 3, 64, 2000] {
                let mut out = vec![0u32; len];
                for_each_chunk(&mut out, chunk, |i, c| {
                    for v in c.iter_mut() {
                        *v += 1 + i as u32;
                    }
                });
                for (j, v) in out.iter().enumerate() {
                    assert_eq!(*v, 1 + (j / chunk) as u32, "len {len} chunk {chunk}");
                }
            }
        }
    }

    #[test]
    fn threads_share_the_pool() {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let mut out = vec![0u64; 97];
                        for_each_chunk(&mut out, 5, |i, c| c.fill(t * 1000 + i as u64));
                        assert!(
                            out.iter()
                                .enumerate()
                                .all(|(j, &v)| v == t * 1000 + (j / 5) as u64)
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
