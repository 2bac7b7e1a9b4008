//! `silica activations`: the hidden states of chosen layers for many
//! prompts, pooled per prompt, streamed into a safetensors (or .npy) file
//! that `silica probe train`, numpy and PyTorch read. The capture itself is
//! `Llama::capture` / `Bert::capture`; the file is
//! `silica_models::capture::file`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use silica::{DType, Device};
use silica_models::bert::SentenceEncoder;
use silica_models::capture::{
    ActivationMeta, ActivationWriter, CaptureSpec, Pool, Site, Source, batches, parse_layers,
};
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::resolve;
use silica_models::tokenizer::Tokenizer;

use crate::progress::Progress;
use crate::{CliError, emit};

/// Prompt texts are kept in the file's metadata up to this many bytes.
const TEXTS_MAX_BYTES: usize = 32 << 20;

#[derive(clap::Args)]
pub struct ActivationsArgs {
    /// Prompts (the lines of --file come after them).
    prompts: Vec<String>,
    /// Prompts, one per line ("-": standard input): a .jsonl file of
    /// objects with "text" (or "prompt", or "ids": token ids used as they
    /// are) and optional "id" and "label", any other file one prompt per line.
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Where to write: OUT.safetensors, or OUT.npy (array [points, rows,
    /// d]) with its metadata in OUT.json.
    #[arg(long, short = 'o', value_name = "OUT")]
    output: PathBuf,
    /// A GGUF decoder (default: the built-in SmolLM2-135M-Instruct), or
    /// with --encoder a sentence-transformers folder (default:
    /// all-MiniLM-L6-v2).
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// Capture from a BERT-family sentence encoder instead of a decoder.
    #[arg(long)]
    encoder: bool,
    /// Layers, numbered as transformers' hidden_states: 0 the embeddings,
    /// i the output of block i, the last after the final norm; negative
    /// from the end; ranges a..b; or "all".
    #[arg(
        long,
        value_name = "LIST",
        default_value = "-1",
        allow_hyphen_values = true
    )]
    layers: String,
    /// Pooling per prompt: last (the last token), mean (over the tokens)
    /// or all (every token, with an offsets tensor).
    #[arg(long, value_name = "POOL", default_value = "last")]
    pool: String,
    /// What to read at each layer: residual (the hidden state), attn
    /// and/or mlp (a block's outputs), comma-separated.
    #[arg(long, value_name = "LIST", default_value = "residual")]
    sites: String,
    /// cpu, gpu, gpu:N, metal, vulkan, dx12, gl or part of an adapter's name
    /// [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Compute dtype of the activations and unquantized weights, and the
    /// dtype stored: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Prompts per forward pass (fewer when prompts are long).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = parse_positive)]
    batch_size: usize,
    /// Cut prompts to their first N tokens (longer prompts are an error
    /// otherwise only past the model's context).
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    max_tokens: Option<usize>,
}

pub fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err("expected a whole number, 1 or more".to_string()),
    }
}

/// One prompt of a prompt file.
#[derive(Clone, Debug)]
pub struct Prompt {
    pub text: String,
    pub id: Option<String>,
    pub label: Option<String>,
    /// Token ids given instead of a text (`"ids"`), used as they are.
    pub tokens: Option<Vec<u32>>,
}

/// Prompts from `path` ("-": standard input): JSON objects per line for
/// `.jsonl` files, else plain lines; blank lines are skipped.
/// The prompts given on the command line, then those of `file`.
pub fn gather_prompts(texts: &[String], file: Option<&Path>) -> Result<Vec<Prompt>, CliError> {
    let mut prompts: Vec<Prompt> = texts
        .iter()
        .map(|t| Prompt {
            text: t.clone(),
            id: None,
            label: None,
            tokens: None,
        })
        .collect();
    if let Some(file) = file {
        prompts.extend(read_prompts(file)?);
    }
    Ok(prompts)
}

pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>, CliError> {
    let text = crate::read_text_file(path)?;
    let jsonl = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson"));
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if !jsonl {
            out.push(Prompt {
                text: line.to_string(),
                id: None,
                label: None,
                tokens: None,
            });
            continue;
        }
        let at = || format!("{} line {}", path.display(), n + 1);
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| CliError::msg(format!("{}: not JSON: {e}", at())))?;
        let tokens = match v.get("ids") {
            None => None,
            Some(ids) => Some(
                ids.as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()))
                            .collect::<Option<Vec<u32>>>()
                    })
                    .ok_or_else(|| {
                        CliError::msg(format!("{}: \"ids\" must be a list of token ids", at()))
                    })?,
            ),
        };
        let text = match v.get("text").or_else(|| v.get("prompt")) {
            Some(t) => t
                .as_str()
                .ok_or_else(|| CliError::msg(format!("{}: \"text\" must be a string", at())))?,
            None if tokens.is_some() => "",
            None => {
                return Err(CliError::msg(format!(
                    "{}: no \"text\" string (or \"ids\" list)",
                    at()
                )));
            }
        };
        let scalar = |key: &str| scalar_field(&v, key, &at);
        out.push(Prompt {
            text: text.to_string(),
            id: scalar("id")?,
            label: scalar("label")?,
            tokens,
        });
    }
    Ok(out)
}

/// Field `key` of a JSON line as text: a string, or a number or boolean
/// written out; `None` where it is absent or null; an error naming the
/// line (`at`) for anything else.
pub(crate) fn scalar_field(
    v: &serde_json::Value,
    key: &str,
    at: &dyn Fn() -> String,
) -> Result<Option<String>, CliError> {
    match v.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(x @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
            Ok(Some(x.to_string()))
        }
        Some(_) => Err(CliError::msg(format!(
            "{}: \"{key}\" must be a string, number or boolean",
            at()
        ))),
    }
}

/// A model states can be captured from, with its tokenizer.
pub enum Capturer {
    Decoder(Box<Llama>, Box<Tokenizer>),
    Encoder(Box<SentenceEncoder>),
}

impl Capturer {
    /// Loads the decoder (or with `encoder` the sentence encoder) `model`
    /// names onto `device`; returns it and the path it came from.
    pub fn load(
        model: Option<&str>,
        encoder: bool,
        device: &Device,
        dtype: DType,
    ) -> Result<(Capturer, String), CliError> {
        if encoder {
            let dir = resolve::resolve_encoder(model)?;
            let enc = SentenceEncoder::load(&dir, device, dtype)?;
            return Ok((Capturer::Encoder(Box::new(enc)), dir.display().to_string()));
        }
        let path = resolve::resolve_decoder(model)?;
        let gguf = GgufFile::open(&path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let opts = LoadOptions {
            dtype,
            dequantize: false,
        };
        let llama = Llama::load_with(&gguf, device, opts)?;
        Ok((
            Capturer::Decoder(Box::new(llama), Box::new(tokenizer)),
            path.display().to_string(),
        ))
    }

    /// The loaded model, borrowed for capture.
    pub fn source(&self) -> Source<'_> {
        match self {
            Capturer::Decoder(m, t) => Source::Decoder(m, t),
            Capturer::Encoder(e) => Source::Encoder(e),
        }
    }
}

pub fn run(args: &ActivationsArgs) -> Result<(), CliError> {
    // the cheap checks first
    let pool = Pool::parse(&args.pool)?;
    let sites: Vec<Site> = args
        .sites
        .split(',')
        .map(Site::parse)
        .collect::<Result<_, _>>()?;
    let dtype = crate::generate::parse_dtype(&args.dtype)?;
    let ext = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    if !ext.eq_ignore_ascii_case("safetensors") && !ext.eq_ignore_ascii_case("npy") {
        return Err(CliError::msg(format!(
            "{}: write activations as .safetensors or .npy",
            args.output.display()
        )));
    }
    let prompts = gather_prompts(&args.prompts, args.file.as_deref())?;
    if prompts.is_empty() {
        return Err(CliError::msg(
            "no prompts: pass some, or --file FILE (.jsonl with \"text\", or one per line)".into(),
        ));
    }
    let device = crate::open_device(args.device.as_deref())?;
    let load_start = Instant::now();
    let (loaded, model_name) = Capturer::load(args.model.as_deref(), args.encoder, &device, dtype)?;
    let model = loaded.source();
    let load_time = load_start.elapsed();
    let n_layers = model.n_layers();
    let layers = parse_layers(&args.layers, n_layers)?;
    let mut points = Vec::new();
    for &l in &layers {
        for &s in &sites {
            // a block's outputs do not exist for the embeddings
            if l == 0 && s != Site::Residual {
                continue;
            }
            points.push((l, s));
        }
    }
    let spec = CaptureSpec { points, pool };
    spec.check(n_layers)?;

    let limit = args
        .max_tokens
        .unwrap_or(usize::MAX)
        .min(model.max_tokens());
    let mut ids: Vec<Vec<u32>> = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let mut t = match &p.tokens {
            Some(t) => t.clone(),
            None => model.tokenize(&p.text)?,
        };
        if t.is_empty() {
            return Err(CliError::msg(format!("prompt {} has no tokens", i + 1)));
        }
        if t.len() > limit {
            if args.max_tokens.is_none() {
                return Err(CliError::msg(format!(
                    "prompt {} has {} tokens, more than the model's {limit}; cut prompts with --max-tokens N",
                    i + 1,
                    t.len()
                )));
            }
            t.truncate(limit);
        }
        ids.push(t);
    }
    let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
    let offsets: Option<Vec<u64>> = (pool == Pool::All).then(|| {
        let mut o = vec![0u64];
        for &l in &lens {
            o.push(o.last().copied().unwrap_or(0) + l as u64);
        }
        o
    });
    let text_bytes: usize = prompts.iter().map(|p| p.text.len()).sum();
    let all_have = |f: &dyn Fn(&Prompt) -> bool| prompts.iter().all(f);
    let meta = ActivationMeta {
        model: model_name,
        architecture: model.architecture(),
        n_layers,
        d_model: model.d_model(),
        points: spec.points.clone(),
        pool,
        dtype,
        count: prompts.len(),
        offsets: offsets.clone(),
        texts: (text_bytes <= TEXTS_MAX_BYTES)
            .then(|| prompts.iter().map(|p| p.text.clone()).collect()),
        ids: all_have(&|p| p.id.is_some()).then(|| {
            prompts
                .iter()
                .map(|p| p.id.clone().unwrap_or_default())
                .collect()
        }),
        labels: all_have(&|p| p.label.is_some()).then(|| {
            prompts
                .iter()
                .map(|p| p.label.clone().unwrap_or_default())
                .collect()
        }),
    };
    let mut writer = ActivationWriter::create(&args.output, &meta)?;

    let start = Instant::now();
    let plan = batches(&lens, args.batch_size);
    let mut progress = Progress::new(prompts.len(), args.batch_size, "captured", "prompts");
    let mut done = 0;
    let d = meta.d_model;
    for batch in &plan {
        let seqs: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
        let states = model.capture(&seqs, &spec)?;
        for (p, t) in states.iter().enumerate() {
            let v: Vec<f32> = t.to_vec()?;
            let mut at = 0;
            for &i in batch {
                let (row, n) = match &offsets {
                    Some(o) => (o[i] as usize, lens[i]),
                    None => (i, 1),
                };
                writer.write_rows(p, row, &v[at * d..(at + n) * d])?;
                at += n;
            }
        }
        done += batch.len();
        progress.update(done, prompts.len());
    }
    progress.finish();
    writer.finish()?;
    let secs = start.elapsed().as_secs_f64();
    let tokens: usize = lens.iter().sum();
    emit(&format!(
        "captured {} prompts ({tokens} tokens), {} point(s) of {d} values, {} pooling, in {secs:.2} s \
         ({:.1} prompts/s, model loaded in {:.2} s) on {} -> {}\n",
        prompts.len(),
        spec.points.len(),
        pool.name(),
        prompts.len() as f64 / secs.max(1e-9),
        load_time.as_secs_f64(),
        device.info().name,
        args.output.display()
    ))
}
