//! The decode loop of `silica serve`: one thread owns the model and runs
//! continuous batching. Each step is one [`Llama::forward_pooled`] over
//! every active sequence (a token each for those decoding, a chunk of the
//! prompt for those starting), so that the weights are read once per step
//! whatever the number of clients, and the attention of a layer is one op
//! for all of them: the sequences' KV caches are the slots of one pool.
//! Requests join between steps, up to `parallel` active sequences (the
//! rest wait in arrival order); a request whose client has gone is dropped
//! at the next step, and its slot freed.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use silica::Tensor;
use silica_models::llama::{KvPool, Llama, PoolStep};
use silica_models::sampling::{Sampler, SamplingParams};
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
        completion_tokens: usize,
    },
    /// The job failed (an HTTP status and a message); nothing follows.
    Failed { status: u16, message: String },
}

/// The HTTP side's handle on the engine.
pub struct Engine {
    jobs: mpsc::Sender<Job>,
    /// Jobs waiting for a free sequence slot.
    pub queued: Arc<AtomicUsize>,
}

impl Engine {
    /// Starts the decode thread for `model`, with a KV pool of `parallel`
    /// slots.
    pub fn start(
        model: Llama,
        tokenizer: Arc<Tokenizer>,
        parallel: usize,
        context: usize,
        metrics: Arc<Metrics>,
    ) -> silica_models::Result<Engine> {
        let pool = model.new_pool(parallel)?;
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let (q, a) = (queued.clone(), active.clone());
        std::thread::Builder::new()
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
                }
                .run(rx)
            })
            .expect("the engine thread starts");
        Ok(Engine { jobs: tx, queued })
    }

    /// Queues a job; false when the engine has stopped.
    pub fn submit(&self, job: Job) -> bool {
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.jobs.send(job).is_err() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// A sequence being processed.
struct Seq<'a> {
    job: Job,
    /// Its KV cache's slot in the pool.
    slot: usize,
    sampler: Sampler,
    /// Prompt tokens already in the cache.
    fed: usize,
    /// The last sampled token, not yet in the cache.
    next: Option<u32>,
    history: Vec<u32>,
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
}

impl<'a> Runner<'a> {
    fn run(self, rx: mpsc::Receiver<Job>) {
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut seqs: Vec<Seq<'a>> = Vec::new();
        loop {
            if seqs.is_empty() && waiting.is_empty() {
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
            seqs.retain(|s| !s.job.events.is_closed());
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
            if !seqs.is_empty() {
                self.step(&mut seqs);
            }
        }
    }

    /// Frees the slots of the sequences that are gone.
    fn free_slots(&self, seqs: &[Seq<'a>]) {
        let mut pool = self.pool.borrow_mut();
        for slot in 0..pool.slots() {
            if !seqs.iter().any(|s| s.slot == slot) {
                pool.release(slot);
            }
        }
    }

    fn admit(&self, job: Job) -> Seq<'a> {
        let sampler = Sampler::new(job.params.clone());
        // invariant: at most `parallel` sequences, the pool's slot count,
        // and the slots of those gone freed
        let slot = self
            .pool
            .borrow_mut()
            .acquire()
            .expect("a free slot for each admitted sequence");
        Seq {
            history: job.prompt.clone(),
            job,
            slot,
            sampler,
            fed: 0,
            next: None,
            generated: 0,
            stream: TokenStream::new(self.tokenizer),
            text: String::new(),
            sent: 0,
            first_token: true,
            finished: false,
        }
    }

    /// One forward pass over the sequences that have work, then a token
    /// for each whose prompt is all in.
    fn step(&self, seqs: &mut Vec<Seq<'a>>) {
        let mut budget = PREFILL_PER_STEP;
        // (index into seqs, the tokens it feeds this step)
        let mut plan: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if let Some(t) = s.next {
                plan.push((i, vec![t]));
            } else if budget > 0 {
                let n = (s.job.prompt.len() - s.fed).min(budget);
                budget -= n;
                plan.push((i, s.job.prompt[s.fed..s.fed + n].to_vec()));
            }
        }
        let started = Instant::now();
        let logits = match self.forward(seqs, &plan) {
            Ok(l) => l,
            Err(failed) => {
                // a failure of the batch (out of memory, a lost device):
                // each sequence on its own, so that only those that fail
                // alone are failed
                for (i, ids) in plan.iter().rev() {
                    let one = vec![(*i, ids.clone())];
                    match self.forward(seqs, &one) {
                        Ok(l) => self.advance(&mut seqs[*i], ids.len(), &l, 0),
                        Err(e) => {
                            let s = seqs.remove(*i);
                            fail(&s.job, &e);
                        }
                    }
                }
                eprintln!(
                    "silica serve: a batched step failed ({failed}); its sequences ran alone"
                );
                self.finish_done(seqs);
                return;
            }
        };
        let tokens: usize = plan.iter().map(|p| p.1.len()).sum();
        self.metrics.step(tokens, started.elapsed());
        for (row, (i, ids)) in plan.iter().enumerate() {
            self.advance(&mut seqs[*i], ids.len(), &logits, row);
        }
        self.finish_done(seqs);
    }

    /// The forward pass of `plan`: the logits rows on the host, or the error.
    fn forward(
        &self,
        seqs: &mut [Seq<'a>],
        plan: &[(usize, Vec<u32>)],
    ) -> silica_models::Result<Logits> {
        let steps: Vec<PoolStep> = plan
            .iter()
            .map(|(i, ids)| PoolStep {
                slot: seqs[*i].slot,
                ids,
            })
            .collect();
        let logits = self
            .model
            .forward_pooled(&mut self.pool.borrow_mut(), &steps)?;
        let greedy: Vec<bool> = plan
            .iter()
            .map(|(i, _)| seqs[*i].sampler.is_argmax())
            .collect();
        Ok(Logits::read(&logits, &greedy)?)
    }

    /// Takes one step's result for `s` (it fed `fed` tokens; its logits are
    /// row `row`): more of the prompt in, or a new token out.
    fn advance(&self, s: &mut Seq<'a>, fed: usize, logits: &Logits, row: usize) {
        if s.next.take().is_none() {
            s.fed += fed;
            if s.fed < s.job.prompt.len() {
                return;
            }
        }
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
        let cached = self.pool.borrow().len(s.slot);
        if s.generated >= s.job.max_tokens || cached + 1 >= self.context {
            self.flush(s);
            self.done(s, Finish::Length);
            return;
        }
        s.next = Some(token);
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
            completion_tokens: s.generated,
        });
        s.next = None;
        s.finished = true;
    }

    fn finish_done(&self, seqs: &mut Vec<Seq<'a>>) {
        seqs.retain(|s| !s.finished);
        self.active.store(seqs.len(), Ordering::SeqCst);
        self.metrics
            .set_load(self.queued.load(Ordering::SeqCst), seqs.len());
    }
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

/// A step's logits on the host: each row's argmax, and the full rows of
/// the sequences that sample.
struct Logits {
    argmax: Vec<u32>,
    rows: Vec<Option<Vec<f32>>>,
}

impl Logits {
    fn read(logits: &Tensor, greedy: &[bool]) -> silica::Result<Logits> {
        let argmax: Vec<u32> = logits.argmax(-1, false)?.to_vec()?;
        let vocab = logits.shape()[1];
        let rows = if greedy.iter().all(|&g| g) {
            vec![None; greedy.len()]
        } else {
            let all: Vec<f32> = logits.to_vec()?;
            greedy
                .iter()
                .enumerate()
                .map(|(r, &g)| (!g).then(|| all[r * vocab..(r + 1) * vocab].to_vec()))
                .collect()
        };
        Ok(Logits { argmax, rows })
    }

    fn pick(&self, row: usize, sampler: &mut Sampler, history: &[u32]) -> u32 {
        match &self.rows[row] {
            Some(l) => sampler.sample(l, history),
            None => self.argmax[row],
        }
    }
}
