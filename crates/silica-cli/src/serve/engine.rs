//! The decode loop of `silica serve`: one thread owns the model and runs
//! continuous batching. Each step is one [`Llama::forward_pooled`] over
//! every active sequence (a token each for those decoding, a chunk of the
//! prompt for those starting), so that the weights are read once per step
//! whatever the number of clients, and the attention of a layer is one op
//! for all of them: the sequences' KV caches are the slots of one pool.
//! Requests join between steps, up to `parallel` active sequences (the
//! rest wait in arrival order); a request whose client has gone is dropped
//! at the next step, and its slot freed.
//!
//! A sequence leaving keeps its positions in its slot, and a new prompt
//! takes the free slot whose kept tokens share the longest start with it,
//! so only the rest of the prompt is computed (a chat's earlier turns, a
//! fixed system prompt); a prompt that shares nothing takes the slot freed
//! longest ago. `--no-prompt-cache` turns this off.
//!
//! Tokens are picked on the device where they can be: greedily, or drawn
//! at a temperature, with top-k, top-p and min-p cuts on a GPU
//! (`sampling::draw_rows`, seeded by the request's seed and the token's
//! index). On a GPU, while every sequence that gets a token from a step
//! picks it there, the next step is queued on the step's picks before they
//! are read back
//! (`Llama::forward_pooled_picked`), so the GPU works while the host reads,
//! detokenizes and sends; a sequence that ends on such a token has its row
//! of the next step dropped. A sequence with penalties (repetition,
//! frequency, presence) has them applied on a GPU before its pick
//! (`sampling::penalize_rows`, its history and its token in flight); on
//! the CPU its logits are read and it picks on the host.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use silica::{PendingRead, Tensor};
use silica_models::llama::{KvPool, Llama, PickedStep, PoolStep};
use silica_models::sampling::{
    Penalties, RowDraw, Sampler, SamplingParams, draw_rows, penalize_rows,
};
use silica_models::tokenizer::{TokenStream, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;

/// Prompt tokens processed per step, over all starting sequences: a long
/// prompt is cut into chunks so that the decoding sequences beside it wait
/// at most one chunk's time per step.
const PREFILL_PER_STEP: usize = 512;

/// What a request asks the engine for.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
}

/// Why a generation ended, in OpenAI's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the engine sends back about a job.
#[derive(Debug)]
pub enum Event {
    /// More generated text.
    Text(String),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        /// Of the prompt tokens, those reused from an earlier request's
        /// KV cache.
        cached_tokens: usize,
        completion_tokens: usize,
    },
    /// The job failed (an HTTP status and a message); nothing follows.
    Failed { status: u16, message: String },
}

/// The HTTP side's handle on the engine.
pub struct Engine {
    /// `None` once the engine is shut down.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Jobs waiting for a free sequence slot.
    pub queued: Arc<AtomicUsize>,
    /// Tells the decode thread to drop what it holds and end.
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the decode thread for `model`, with a KV pool of `parallel`
    /// slots.
    pub fn start(
        model: Llama,
        tokenizer: Arc<Tokenizer>,
        parallel: usize,
        context: usize,
        prompt_cache: bool,
        metrics: Arc<Metrics>,
    ) -> silica_models::Result<Engine> {
        let mut pool = model.new_pool(parallel)?;
        // the steps' kernels before the server is ready; one that fails to
        // build here is built (or reported) by the step that needs it
        if let Err(e) = model.build_pooled_kernels(&mut pool, PREFILL_PER_STEP.min(context)) {
            eprintln!(
                "silica serve: building the kernels ahead failed ({e}); steps build them as they come"
            );
        }
        // and those an earlier server listed (Device::build_kernels_ahead)
        model.device().wait_kernels_ahead();
        // and one real step, whose first run on the device costs more
        if let Err(e) = model.warm_up_pooled(&mut pool) {
            eprintln!("silica serve: the warm-up step failed ({e}); serving anyway");
        }
        // and the kernels of the draws at a temperature, with a cut
        let draw = RowDraw {
            inv_temperature: 1.0,
            top_k: 1,
            ..RowDraw::argmax()
        };
        let drawn = Tensor::zeros(&[1, 2], silica::DType::F32, model.device())
            .and_then(|l| draw_rows(&l, &[draw]))
            .and_then(|t| t.to_vec::<u32>());
        if let Err(e) = drawn {
            eprintln!("silica serve: the warm-up draw failed ({e}); serving anyway");
        }
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let (q, a) = (queued.clone(), active.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("silica-engine".into())
            .spawn(move || {
                Runner {
                    model: &model,
                    pool: RefCell::new(pool),
                    tokenizer: &tokenizer,
                    parallel,
                    context,
                    metrics,
                    queued: q,
                    active: a,
                    next_id: Cell::new(0),
                    stop: stopped,
                    prompt_cache,
                    kept: RefCell::new(vec![Vec::new(); parallel]),
                    freed_at: RefCell::new(vec![0; parallel]),
                    frees: Cell::new(0),
                }
                .run(rx)
            })
            .map_err(|e| silica_models::Error::Io {
                path: "the engine thread".into(),
                source: e,
            })?;
        Ok(Engine {
            jobs: Mutex::new(Some(tx)),
            queued,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a job; false when the engine has stopped.
    pub fn submit(&self, job: Job) -> bool {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(jobs) = jobs.as_ref() else {
            return false;
        };
        self.queued.fetch_add(1, Ordering::SeqCst);
        if jobs.send(job).is_err() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Ends the decode thread and waits until it has released the model
    /// and its KV pool: sequences still in flight are dropped (their
    /// streams end). The process must not exit while that thread still
    /// frees device memory, since the driver's own teardown at exit may
    /// run beside it.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        drop(self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread
            && t.join().is_err()
        {
            eprintln!("silica serve: the engine thread panicked");
        }
    }
}

/// A sequence being processed.
struct Seq<'a> {
    /// Unique over the engine's life (a slot is reused by later sequences).
    id: u64,
    job: Job,
    /// Its KV cache's slot in the pool.
    slot: usize,
    sampler: Sampler,
    /// Prompt tokens fed to the device (queued, perhaps not yet run).
    fed: usize,
    /// The last sampled token, not yet in the cache.
    next: Option<u32>,
    history: Vec<u32>,
    /// Prompt tokens whose positions the slot kept from its last sequence.
    cached: usize,
    /// Steps queued that pick a token for it (the counter of its next
    /// draw on the device).
    drawn: u64,
    generated: usize,
    stream: TokenStream<'a>,
    /// All generated text, and how much of it was sent.
    text: String,
    sent: usize,
    first_token: bool,
    finished: bool,
}

struct Runner<'a> {
    model: &'a Llama,
    pool: RefCell<KvPool>,
    tokenizer: &'a Tokenizer,
    parallel: usize,
    context: usize,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    next_id: Cell<u64>,
    /// Set by [`Engine::shutdown`].
    stop: Arc<AtomicBool>,
    /// Free slots keep their last sequence's positions for a prompt that
    /// starts the same way.
    prompt_cache: bool,
    /// Per slot: the tokens of the positions a free slot kept.
    kept: RefCell<Vec<Vec<u32>>>,
    /// Per slot: when it was last freed (a count of frees).
    freed_at: RefCell<Vec<u64>>,
    frees: Cell<u64>,
}

/// What a sequence feeds one step.
#[derive(Clone)]
struct Feed {
    seq: u64,
    slot: usize,
    /// Tokens from the host; empty when the token is `picked`.
    ids: Vec<u32>,
    /// The token is row `picked` of the previous step's picks, still on
    /// the device.
    picked: Option<usize>,
    /// Its logits row gives a token (the prompt is all in).
    emits: bool,
}

/// A step queued on the device whose tokens have not been read back. Its
/// rows are its feeds' (those from the host first, as
/// `forward_pooled_picked` orders them).
struct Queued {
    feeds: Vec<Feed>,
    /// Each row's token picked on the device (argmax or drawn), the next
    /// step's picked tokens.
    picks: Tensor,
    /// The picks on their way back, submitted with the step so that a step
    /// queued after it does not delay it.
    picks_read: PendingRead,
    /// The whole logits on their way back, where a row samples.
    logits_read: Option<PendingRead>,
    started: Instant,
}

impl<'a> Runner<'a> {
    fn run(self, rx: mpsc::Receiver<Job>) {
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut seqs: Vec<Seq<'a>> = Vec::new();
        let mut pending: Option<Queued> = None;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            if seqs.is_empty() && waiting.is_empty() && pending.is_none() {
                match rx.recv() {
                    Ok(job) => waiting.push_back(job),
                    // every sender is gone: the server has stopped
                    Err(_) => return,
                }
            }
            while let Ok(job) = rx.try_recv() {
                waiting.push_back(job);
            }
            // clients that left free their slot at once
            waiting.retain(|j| !j.events.is_closed());
            self.drop_seqs(&mut seqs, |s| s.job.events.is_closed());
            self.free_slots(&seqs);
            while seqs.len() < self.parallel {
                let Some(job) = waiting.pop_front() else {
                    break;
                };
                seqs.push(self.admit(job));
            }
            self.queued.store(waiting.len(), Ordering::SeqCst);
            self.active.store(seqs.len(), Ordering::SeqCst);
            self.metrics.set_load(waiting.len(), seqs.len());
            if !seqs.is_empty() || pending.is_some() {
                self.step(&mut seqs, &mut pending);
            }
        }
    }

    /// Frees the slots that no sequence holds (those of sequences dropped
    /// without [`Runner::drop_seqs`]; none in the usual course).
    fn free_slots(&self, seqs: &[Seq<'a>]) {
        let mut pool = self.pool.borrow_mut();
        for slot in 0..pool.slots() {
            if pool.in_use(slot) && !seqs.iter().any(|s| s.slot == slot) {
                pool.release(slot);
                self.kept.borrow_mut()[slot].clear();
            }
        }
    }

    /// Removes the sequences for which `gone` holds, freeing their slots.
    /// A slot keeps the positions whose tokens are known: the prompt's and
    /// the generated tokens', not one whose step was queued but not read.
    fn drop_seqs(&self, seqs: &mut Vec<Seq<'a>>, gone: impl Fn(&Seq<'a>) -> bool) {
        seqs.retain(|s| {
            if !gone(s) {
                return true;
            }
            let mut pool = self.pool.borrow_mut();
            let keep = if self.prompt_cache {
                pool.len(s.slot).min(s.history.len())
            } else {
                0
            };
            pool.release_keeping(s.slot, keep);
            self.kept.borrow_mut()[s.slot] = s.history[..keep].to_vec();
            self.frees.set(self.frees.get() + 1);
            self.freed_at.borrow_mut()[s.slot] = self.frees.get();
            false
        });
    }

    /// Takes the free slot for `prompt` and returns it with the prompt
    /// tokens it already holds: the slot whose kept tokens share the
    /// longest start with the prompt, where that start is at least half of
    /// them, else the slot freed longest ago (so that a prompt sharing
    /// little, a start token or a stock system prompt, does not take a
    /// long conversation's cache while a staler slot is free). The prompt's
    /// last token is always computed: its logits give the first new token.
    fn take_slot(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let mut pool = self.pool.borrow_mut();
        let (kept, freed_at) = (self.kept.borrow(), self.freed_at.borrow());
        let most = prompt.len().saturating_sub(1);
        let shared = |slot: usize| {
            kept[slot]
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let (_, _, slot, held) = (0..pool.slots())
            .filter(|&slot| !pool.in_use(slot))
            .map(|slot| {
                let n = shared(slot);
                let score = if n > 0 && 2 * n >= kept[slot].len() {
                    n.min(most)
                } else {
                    0
                };
                (score, Reverse(freed_at[slot]), slot, n.min(most))
            })
            .max()?;
        let held = pool.acquire_at(slot, held)?;
        Some((slot, held))
    }

    fn admit(&self, job: Job) -> Seq<'a> {
        let sampler = Sampler::new(job.params.clone());
        // invariant: at most `parallel` sequences, the pool's slot count,
        // and the slots of those gone freed
        let (slot, cached) = self
            .take_slot(&job.prompt)
            .expect("a free slot for each admitted sequence");
        self.metrics.cached(cached);
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        Seq {
            id,
            history: job.prompt.clone(),
            job,
            slot,
            sampler,
            cached,
            drawn: 0,
            fed: cached,
            next: None,
            generated: 0,
            stream: TokenStream::new(self.tokenizer),
            text: String::new(),
            sent: 0,
            first_token: true,
            finished: false,
        }
    }

    /// Queues the next step and reads the one before it: ahead of the
    /// read where the pending step's tokens can feed the next on the device.
    fn step(&self, seqs: &mut Vec<Seq<'a>>, pending: &mut Option<Queued>) {
        let ahead = pending.as_ref().filter(|p| self.can_queue_ahead(seqs, p));
        if ahead.is_none()
            && let Some(p) = pending.take()
        {
            self.read(seqs, p, &[]);
        }
        let feeds = self.plan(seqs, pending.as_ref());
        let queued = if feeds.is_empty() {
            None
        } else {
            match self.queue(seqs, feeds.clone(), pending.as_ref()) {
                Ok(q) => Some(q),
                Err(failed) if pending.is_some() => {
                    // read the step before, then plan again without it
                    eprintln!("silica serve: a step queued ahead failed ({failed}); retrying");
                    if let Some(p) = pending.take() {
                        self.read(seqs, p, &[]);
                    }
                    self.finish_done(seqs);
                    return;
                }
                Err(failed) => {
                    self.each_alone(seqs, feeds, &failed);
                    self.finish_done(seqs);
                    return;
                }
            }
        };
        if let Some(q) = &queued {
            for f in &q.feeds {
                let Some(s) = seqs.iter_mut().find(|s| s.id == f.seq) else {
                    continue;
                };
                s.drawn += u64::from(f.emits);
                if f.picked.is_none() && s.next.take().is_none() {
                    s.fed += f.ids.len();
                }
            }
        }
        if let Some(p) = pending.take() {
            let next = queued.as_ref().map_or(&[][..], |q| &q.feeds[..]);
            self.read(seqs, p, next);
        }
        *pending = queued;
        self.finish_done(seqs);
    }

    /// Whether every sequence that gets a token from `p` picks it
    /// on the device, so that the next step can be queued on `p`'s picks (on
    /// a GPU, where the queue runs ahead of the host).
    fn can_queue_ahead(&self, seqs: &[Seq<'a>], p: &Queued) -> bool {
        self.model.device().is_gpu()
            && p.feeds
                .iter()
                .filter(|f| f.emits)
                .all(|f| on_device(seqs, f.seq, self.model.device()))
    }

    /// What each sequence feeds the next step. With `pending` (queued
    /// ahead), a sequence that gets a token from it feeds that token from
    /// the device unless the token will be its last.
    fn plan(&self, seqs: &[Seq<'a>], pending: Option<&Queued>) -> Vec<Feed> {
        let mut budget = PREFILL_PER_STEP;
        let (mut host, mut picked) = (Vec::new(), Vec::new());
        let pool = self.pool.borrow();
        for s in seqs.iter().filter(|s| !s.finished) {
            let from = pending.and_then(|p| p.feeds.iter().position(|f| f.seq == s.id && f.emits));
            if let Some(row) = from {
                let len = pool.len(s.slot);
                if s.generated + 1 < s.job.max_tokens && len + 1 < self.context {
                    picked.push(Feed {
                        seq: s.id,
                        slot: s.slot,
                        ids: Vec::new(),
                        picked: Some(row),
                        emits: true,
                    });
                }
            } else if let Some(t) = s.next {
                host.push(Feed {
                    seq: s.id,
                    slot: s.slot,
                    ids: vec![t],
                    picked: None,
                    emits: true,
                });
            } else if s.fed < s.job.prompt.len() && budget > 0 {
                let n = (s.job.prompt.len() - s.fed).min(budget);
                budget -= n;
                host.push(Feed {
                    seq: s.id,
                    slot: s.slot,
                    ids: s.job.prompt[s.fed..s.fed + n].to_vec(),
                    picked: None,
                    emits: s.fed + n == s.job.prompt.len(),
                });
            }
        }
        host.extend(picked);
        host
    }

    /// Queues a step of `feeds` (picked tokens from `pending`'s picks):
    /// its logits and their picks stay on the device.
    fn queue(
        &self,
        seqs: &[Seq<'a>],
        feeds: Vec<Feed>,
        pending: Option<&Queued>,
    ) -> silica_models::Result<Queued> {
        let started = Instant::now();
        let steps: Vec<PoolStep> = feeds
            .iter()
            .filter(|f| f.picked.is_none())
            .map(|f| PoolStep {
                slot: f.slot,
                ids: &f.ids,
            })
            .collect();
        let picked: Vec<PickedStep> = feeds
            .iter()
            .filter_map(|f| f.picked.map(|row| PickedStep { slot: f.slot, row }))
            .collect();
        let logits = self.model.forward_pooled_picked(
            &mut self.pool.borrow_mut(),
            &steps,
            &picked,
            pending.map(|p| &p.picks),
        )?;
        let logits = penalized(seqs, &feeds, logits, pending, self.model.device())?;
        let draws: Vec<RowDraw> = feeds
            .iter()
            .map(|f| row_draw(seqs, f, self.model.device()))
            .collect();
        let picks = draw_rows(&logits, &draws)?;
        let device = self.model.device();
        let samples = feeds
            .iter()
            .any(|f| f.emits && !on_device(seqs, f.seq, device));
        let logits_read = if samples {
            Some(logits.read_later()?)
        } else {
            None
        };
        let picks_read = picks.read_later()?;
        Ok(Queued {
            feeds,
            picks,
            picks_read,
            logits_read,
            started,
        })
    }

    /// Reads `q`'s tokens back and hands each sequence its own; `next` is
    /// the step queued after it (a sequence fed there from `q`'s picks
    /// already has its token in flight).
    fn read(&self, seqs: &mut [Seq<'a>], q: Queued, next: &[Feed]) {
        let device: Vec<bool> = q
            .feeds
            .iter()
            .map(|f| on_device(seqs, f.seq, self.model.device()))
            .collect();
        let (feeds, started) = (q.feeds, q.started);
        let logits = match Logits::read(q.picks_read, q.logits_read, &device) {
            Ok(l) => l,
            Err(e) => {
                let e = silica_models::Error::from(e);
                for f in &feeds {
                    if let Some(s) = seqs.iter_mut().find(|s| s.id == f.seq && !s.finished) {
                        fail(&s.job, &e);
                        s.finished = true;
                    }
                }
                return;
            }
        };
        let tokens: usize = feeds.iter().map(|f| f.ids.len().max(1)).sum();
        self.metrics.step(tokens, started.elapsed());
        for (row, f) in feeds.iter().enumerate() {
            let Some(s) = seqs.iter_mut().find(|s| s.id == f.seq && !s.finished) else {
                continue; // its client left, or it ended on the step before
            };
            if f.emits {
                let in_flight = next.iter().any(|n| n.seq == f.seq && n.picked.is_some());
                self.advance(s, &logits, row, in_flight);
            }
        }
    }

    /// After a batched step failed (out of memory, a lost device): each
    /// sequence's feed on its own, so that only those that fail alone fail.
    fn each_alone(&self, seqs: &mut [Seq<'a>], feeds: Vec<Feed>, failed: &silica_models::Error) {
        for f in feeds {
            let seq = f.seq;
            let alone = self.queue(seqs, vec![f], None);
            let Some(s) = seqs.iter_mut().find(|s| s.id == seq) else {
                continue;
            };
            match alone {
                Ok(q) => {
                    let f = &q.feeds[0];
                    s.drawn += u64::from(f.emits);
                    if s.next.take().is_none() {
                        s.fed += f.ids.len();
                    }
                    self.read(std::slice::from_mut(s), q, &[]);
                }
                Err(e) => {
                    fail(&s.job, &e);
                    s.finished = true;
                }
            }
        }
        eprintln!("silica serve: a batched step failed ({failed}); its sequences ran alone");
    }

    /// Takes the token of row `row` for `s`; `in_flight`: the step queued
    /// after already feeds it from the device.
    fn advance(&self, s: &mut Seq<'a>, logits: &Logits, row: usize, in_flight: bool) {
        let token = logits.pick(row, &mut s.sampler, &s.history);
        if s.first_token {
            s.first_token = false;
            self.metrics.first_token(s.job.submitted.elapsed());
        }
        if self.tokenizer.is_eos(token) {
            self.flush(s);
            self.done(s, Finish::Stop);
            return;
        }
        s.history.push(token);
        s.generated += 1;
        self.metrics.generated(1);
        if let Ok(Some(piece)) = s.stream.push(token) {
            s.text.push_str(&piece);
            if self.send_text(s) {
                return;
            }
        }
        let cached = self.pool.borrow().len(s.slot) - usize::from(in_flight);
        if s.generated >= s.job.max_tokens || cached + 1 >= self.context {
            self.flush(s);
            self.done(s, Finish::Length);
            return;
        }
        if !in_flight {
            s.next = Some(token);
        }
    }

    /// Sends the text that can no longer turn into a stop string; ends the
    /// sequence (true) when a stop string appeared.
    fn send_text(&self, s: &mut Seq<'a>) -> bool {
        let stops = &s.job.stop;
        let from = s
            .sent
            .saturating_sub(stops.iter().map(String::len).max().unwrap_or(0));
        let from = floor_char(&s.text, from);
        if let Some(cut) = stops
            .iter()
            .filter(|st| !st.is_empty())
            .filter_map(|st| s.text[from..].find(st.as_str()).map(|p| p + from))
            .min()
        {
            if cut > s.sent {
                let _ = s
                    .job
                    .events
                    .send(Event::Text(s.text[s.sent..cut].to_string()));
            }
            s.sent = s.text.len();
            self.done(s, Finish::Stop);
            return true;
        }
        // hold back a tail that is the start of a stop string
        let mut safe = s.text.len();
        for st in stops.iter().filter(|st| !st.is_empty()) {
            for k in (1..st.len()).rev() {
                if s.text.len() >= k
                    && s.text.is_char_boundary(s.text.len() - k)
                    && st.is_char_boundary(k)
                    && s.text.ends_with(&st[..k])
                {
                    safe = safe.min(s.text.len() - k);
                    break;
                }
            }
        }
        if safe > s.sent {
            let _ = s
                .job
                .events
                .send(Event::Text(s.text[s.sent..safe].to_string()));
            s.sent = safe;
        }
        false
    }

    /// Sends whatever text is left (at the end of a generation).
    fn flush(&self, s: &mut Seq<'a>) {
        if let Ok(Some(rest)) = s.stream.finish() {
            s.text.push_str(&rest);
        }
        if s.text.len() > s.sent {
            let _ = s.job.events.send(Event::Text(s.text[s.sent..].to_string()));
            s.sent = s.text.len();
        }
    }

    /// Ends the sequence: it is removed after the step.
    fn done(&self, s: &mut Seq<'a>, finish: Finish) {
        let _ = s.job.events.send(Event::Done {
            finish,
            prompt_tokens: s.job.prompt.len(),
            cached_tokens: s.cached,
            completion_tokens: s.generated,
        });
        s.next = None;
        s.finished = true;
    }

    fn finish_done(&self, seqs: &mut Vec<Seq<'a>>) {
        self.drop_seqs(seqs, |s| s.finished);
        self.active.store(seqs.len(), Ordering::SeqCst);
        self.metrics
            .set_load(self.queued.load(Ordering::SeqCst), seqs.len());
    }
}

/// Whether sequence `id` picks its tokens on the device, greedily or by
/// [`draw_rows`], its penalties applied there on a GPU (true of one that
/// is gone: its row is dropped whatever it holds).
fn on_device(seqs: &[Seq<'_>], id: u64, device: &silica::Device) -> bool {
    seqs.iter()
        .find(|s| s.id == id)
        .is_none_or(|s| s.sampler.device_pick_on(0, device).is_some())
}

/// How row `f` of a step picks its token on the device: drawn for a
/// sequence whose sampler allows it (its `drawn`-th draw), else the argmax.
fn row_draw(seqs: &[Seq<'_>], f: &Feed, device: &silica::Device) -> RowDraw {
    let s = seqs.iter().find(|s| s.id == f.seq);
    match s {
        Some(s) if f.emits => s
            .sampler
            .device_pick_on(s.drawn, device)
            .map_or(RowDraw::argmax(), |(draw, _)| draw),
        _ => RowDraw::argmax(),
    }
}

/// A step's logits with the penalties of the rows that apply them on the
/// device (`penalize_rows`): each such sequence's history, and its token
/// in flight where it feeds one of `pending`'s picks. The logits as they
/// are where no row has penalties.
fn penalized(
    seqs: &[Seq<'_>],
    feeds: &[Feed],
    logits: Tensor,
    pending: Option<&Queued>,
    device: &silica::Device,
) -> silica_models::Result<Tensor> {
    // each row's penalties and the history they count (none for a row
    // that emits nothing or picks without them)
    let (pens, seen): (Vec<Penalties>, Vec<&[u32]>) = feeds
        .iter()
        .map(|f| {
            let s = seqs.iter().find(|s| s.id == f.seq).filter(|_| f.emits);
            let p = s.and_then(|s| s.sampler.device_pick_on(s.drawn, device));
            match (s, p.and_then(|(_, p)| p)) {
                (Some(s), Some(p)) => (p, &s.history[..]),
                _ => (Penalties::NONE, &[][..]),
            }
        })
        .unzip();
    if pens.iter().all(Penalties::is_none) {
        return Ok(logits);
    }
    let flight: Vec<(u32, u32)> = feeds
        .iter()
        .zip(&pens)
        .enumerate()
        .filter(|(_, (_, p))| !p.is_none())
        .filter_map(|(row, (f, _))| f.picked.map(|pick| (pick as u32, row as u32)))
        .collect();
    let in_flight = pending.map(|p| (&p.picks, &flight[..]));
    Ok(penalize_rows(&logits, &seen, in_flight, &pens)?)
}

fn fail(job: &Job, e: &silica_models::Error) {
    let _ = job.events.send(Event::Failed {
        status: if super::is_oom(e) { 503 } else { 500 },
        message: e.to_string(),
    });
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A step's picks on the host: each row's token picked on the device, and
/// the full logits rows of the sequences that pick on the host.
struct Logits {
    picks: Vec<u32>,
    rows: Vec<Option<Vec<f32>>>,
}

impl Logits {
    fn read(
        picks: PendingRead,
        logits: Option<PendingRead>,
        on_device: &[bool],
    ) -> silica::Result<Logits> {
        let picks: Vec<u32> = picks.to_vec()?;
        let rows = match logits {
            Some(logits) if !on_device.iter().all(|&g| g) => {
                let all: Vec<f32> = logits.to_vec()?;
                let vocab = all.len() / on_device.len().max(1);
                on_device
                    .iter()
                    .enumerate()
                    .map(|(r, &g)| (!g).then(|| all[r * vocab..(r + 1) * vocab].to_vec()))
                    .collect()
            }
            _ => vec![None; on_device.len()],
        };
        Ok(Logits { picks, rows })
    }

    fn pick(&self, row: usize, sampler: &mut Sampler, history: &[u32]) -> u32 {
        match &self.rows[row] {
            Some(l) => sampler.sample(l, history),
            None => self.picks[row],
        }
    }
}
