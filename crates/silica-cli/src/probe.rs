//! `silica probe train` and `silica probe run`: linear probes on the
//! activations `silica activations` captured, and new text read through
//! them. The training is `silica_models::probe`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use silica::DType;
use silica_models::capture::{ActivationFile, CaptureSpec, Pool, Site, batches, parse_layers};
use silica_models::probe::{self, LinearProbe, Metrics, ProbeKind, ProbeSet, TrainOptions};

use crate::activations::{Capturer, gather_prompts, parse_positive};
use crate::{CliError, emit};

#[derive(clap::Args)]
pub struct ProbeArgs {
    #[command(subcommand)]
    command: ProbeCommand,
}

#[derive(clap::Subcommand)]
enum ProbeCommand {
    /// Train logistic-regression probes on captured activations and score
    /// them on a held-out split.
    Train(TrainArgs),
    /// Read text through a trained probe: each class's probability.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct TrainArgs {
    /// The activations (`silica activations -o FILE.safetensors`).
    #[arg(long, value_name = "FILE")]
    activations: PathBuf,
    /// One label per captured prompt, in order: a .jsonl file with
    /// "label", or one label per line [default: the labels the prompt file
    /// gave the capture]
    #[arg(long, value_name = "FILE")]
    labels: Option<PathBuf>,
    /// The captured layer to train on (negative: from the end) [default:
    /// the only one captured]
    #[arg(
        long,
        value_name = "L",
        allow_hyphen_values = true,
        conflicts_with = "all_layers"
    )]
    layer: Option<String>,
    /// Train on every captured layer and report the best.
    #[arg(long)]
    all_layers: bool,
    /// The captured site to train on: residual, attn or mlp.
    #[arg(long, default_value = "residual")]
    site: String,
    /// One softmax probe over the classes instead of one binary probe per
    /// class.
    #[arg(long)]
    multiclass: bool,
    /// L2 penalty: the objective is the mean loss plus l2/2 |W|^2
    /// (scikit-learn's C = 1 / (l2 * training rows)).
    #[arg(long, value_name = "λ", default_value_t = 1e-3)]
    l2: f64,
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = parse_positive)]
    epochs: usize,
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = parse_positive)]
    batch_size: usize,
    /// Peak learning rate of AdamW (decays along a half cosine).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seeds the held-out split and the shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The share of the prompts held out for scoring.
    #[arg(long, default_value_t = 0.25)]
    holdout: f64,
    /// cpu, gpu, gpu:N, ... [default: SILICA_DEVICE, else the best GPU, else the CPU]
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Where to write the probe(s).
    #[arg(long, short = 'o', value_name = "OUT")]
    output: PathBuf,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Texts to read (the lines of --file come after them).
    texts: Vec<String>,
    /// The probe file (`silica probe train -o FILE`).
    #[arg(long, value_name = "FILE")]
    probe: PathBuf,
    /// Texts, one per line (.jsonl: "text" per line).
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Write one JSON line per text to OUT instead of printing.
    #[arg(long, short = 'o', value_name = "OUT")]
    output: Option<PathBuf>,
    /// The model the activations came from [default: the one the probe
    /// file names]
    #[arg(long, value_name = "PATH")]
    model: Option<String>,
    /// The layer's probe to use, of a file with several.
    #[arg(
        long,
        value_name = "L",
        allow_hyphen_values = true,
        conflicts_with = "best_layer"
    )]
    layer: Option<String>,
    /// Use the probe of the layer the file marks best.
    #[arg(long)]
    best_layer: bool,
    #[arg(long, value_name = "SEL")]
    device: Option<String>,
    /// Compute dtype: f32, f16 or bf16 (the probe was trained on the
    /// activations' dtype).
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = parse_positive)]
    batch_size: usize,
}

pub fn run(args: &ProbeArgs) -> Result<(), CliError> {
    match &args.command {
        ProbeCommand::Train(a) => train(a),
        ProbeCommand::Run(a) => run_probe(a),
    }
}

/// Labels from a file: "label" of each JSON line of a .jsonl file, else
/// each non-blank line.
fn read_labels(path: &std::path::Path) -> Result<Vec<String>, CliError> {
    let jsonl = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson"));
    if jsonl {
        let prompts = read_prompts_or_labels(path)?;
        return prompts
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                p.ok_or_else(|| {
                    CliError::msg(format!(
                        "{}: entry {} has no \"label\"",
                        path.display(),
                        i + 1
                    ))
                })
            })
            .collect();
    }
    let text = crate::read_text_file(path)?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect())
}

/// The "label" of each JSON line (a line needs no "text" here).
fn read_prompts_or_labels(path: &std::path::Path) -> Result<Vec<Option<String>>, CliError> {
    let text = crate::read_text_file(path)?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            CliError::msg(format!("{} line {}: not JSON: {e}", path.display(), n + 1))
        })?;
        let at = || format!("{} line {}", path.display(), n + 1);
        out.push(crate::activations::scalar_field(&v, "label", &at)?);
    }
    Ok(out)
}

/// One layer index of a `--layer` argument for a model of `n_layers` blocks.
fn one_layer(s: &str, n_layers: usize) -> Result<usize, CliError> {
    let v = parse_layers(s, n_layers)?;
    match v.as_slice() {
        [one] => Ok(*one),
        _ => Err(CliError::msg(format!("--layer takes one layer, not {s:?}"))),
    }
}

fn train(args: &TrainArgs) -> Result<(), CliError> {
    if !(0.0..1.0).contains(&args.holdout) {
        return Err(CliError::msg(format!(
            "--holdout {} must be at least 0 and below 1",
            args.holdout
        )));
    }
    let site = Site::parse(&args.site)?;
    let acts = ActivationFile::open(&args.activations)?;
    let meta = &acts.meta;
    if meta.pool == Pool::All {
        return Err(CliError::msg(format!(
            "{}: probes train on one state per prompt: capture with --pool last or mean, not all",
            args.activations.display()
        )));
    }
    let labels = match &args.labels {
        Some(path) => read_labels(path)?,
        None => meta.labels.clone().ok_or_else(|| {
            CliError::msg(format!(
                "{} holds no labels (its prompt file had no \"label\" fields): pass --labels FILE",
                args.activations.display()
            ))
        })?,
    };
    if labels.len() != meta.count {
        return Err(CliError::msg(format!(
            "{} labels for {} captured prompts",
            labels.len(),
            meta.count
        )));
    }
    if let Some(i) = labels.iter().position(|l| l.trim().is_empty()) {
        return Err(CliError::msg(format!("label {} is empty", i + 1)));
    }
    let captured: Vec<usize> = meta
        .points
        .iter()
        .filter(|p| p.1 == site)
        .map(|p| p.0)
        .collect();
    if captured.is_empty() {
        return Err(CliError::msg(format!(
            "{}: no {} states were captured",
            args.activations.display(),
            site.name()
        )));
    }
    let layers: Vec<usize> = if args.all_layers {
        captured.clone()
    } else {
        match &args.layer {
            Some(s) => {
                let l = one_layer(s, meta.n_layers)?;
                if !captured.contains(&l) {
                    return Err(CliError::msg(format!(
                        "layer {l} was not captured; {} has layers {captured:?}",
                        args.activations.display()
                    )));
                }
                vec![l]
            }
            None if captured.len() == 1 => captured.clone(),
            None => {
                return Err(CliError::msg(format!(
                    "{} has layers {captured:?}: pick one with --layer L, or --all-layers",
                    args.activations.display()
                )));
            }
        }
    };
    let (classes, ys) = probe::encode_labels(&labels)?;
    let opts = TrainOptions {
        kind: if args.multiclass {
            ProbeKind::Multiclass
        } else {
            ProbeKind::OneVsRest
        },
        l2: args.l2,
        epochs: args.epochs,
        batch_size: args.batch_size,
        lr: args.lr,
        seed: args.seed,
        holdout: args.holdout,
    };
    let (train_rows, test_rows) = probe::split(meta.count, opts.holdout, opts.seed);
    for (k, name) in classes.iter().enumerate() {
        if !train_rows.iter().any(|&r| ys[r] == k) {
            return Err(CliError::msg(format!(
                "class {name:?} has no example left to train on after the held-out split"
            )));
        }
    }
    let device = crate::open_device(args.device.as_deref())?;
    let mut out = String::new();
    writeln!(
        out,
        "{} probe(s), {} classes ({}), {} training and {} held-out prompts, on {}",
        opts.kind.name(),
        classes.len(),
        classes.join(", "),
        train_rows.len(),
        test_rows.len(),
        device.info().name
    )?;
    let mut probes: Vec<LinearProbe> = Vec::new();
    for &layer in &layers {
        let start = Instant::now();
        let x = acts.load(layer, site, &device, DType::F32)?;
        let p = probe::train(
            &x,
            &ys,
            &classes,
            (&train_rows, &test_rows),
            (layer, site),
            &opts,
        )?;
        match &p.metrics {
            Some(m) => writeln!(
                out,
                "layer {layer:>3}: held-out accuracy {:.2}%, macro F1 {:.4}, loss {:.4} ({:.2} s)",
                100.0 * m.accuracy,
                m.macro_f1,
                m.final_loss,
                start.elapsed().as_secs_f64()
            )?,
            None => writeln!(
                out,
                "layer {layer:>3}: trained ({:.2} s)",
                start.elapsed().as_secs_f64()
            )?,
        }
        probes.push(p);
    }
    let best = probes
        .iter()
        .filter_map(|p| p.metrics.as_ref().map(|m| (p.layer, m)))
        .fold(None::<(usize, &Metrics)>, |best, (l, m)| match best {
            Some((_, b)) if (b.accuracy, b.macro_f1) >= (m.accuracy, m.macro_f1) => best,
            _ => Some((l, m)),
        });
    if let Some((layer, m)) = best {
        if probes.len() > 1 {
            writeln!(out, "best layer: {layer}")?;
        }
        write_confusion(&mut out, &classes, m)?;
    }
    let set = ProbeSet {
        best_layer: best.map(|b| b.0),
        probes,
        model: meta.model.clone(),
        architecture: meta.architecture.clone(),
        pool: meta.pool,
        holdout: test_rows,
        options: opts.describe(site),
    };
    set.save(&args.output)?;
    writeln!(out, "wrote {}", args.output.display())?;
    emit(&out)
}

/// The confusion matrix (rows: true class, columns: predicted) and each
/// class's F1.
fn write_confusion(out: &mut String, classes: &[String], m: &Metrics) -> Result<(), CliError> {
    let w = classes
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(4)
        .clamp(4, 16);
    writeln!(out, "confusion matrix (rows: true, columns: predicted):")?;
    write!(out, "{:>w$}", "")?;
    for c in classes {
        write!(out, " {:>w$}", truncate(c, w))?;
    }
    writeln!(out, " {:>6}", "F1")?;
    for (i, c) in classes.iter().enumerate() {
        write!(out, "{:>w$}", truncate(c, w))?;
        for v in &m.confusion[i] {
            write!(out, " {v:>w$}")?;
        }
        writeln!(out, " {:>6.4}", m.f1[i])?;
    }
    Ok(())
}

fn truncate(s: &str, w: usize) -> String {
    s.chars().take(w).collect()
}

fn run_probe(args: &RunArgs) -> Result<(), CliError> {
    let set = ProbeSet::load(&args.probe)?;
    let dtype = crate::generate::parse_dtype(&args.dtype)?;
    let prompts = gather_prompts(&args.texts, args.file.as_deref())?;
    if prompts.is_empty() {
        return Err(CliError::msg(
            "no text to read: pass some, or --file FILE".into(),
        ));
    }
    let encoder = set.architecture == "bert";
    let model_spec = args.model.clone().unwrap_or_else(|| set.model.clone());
    let device = crate::open_device(args.device.as_deref())?;
    let (loaded, _) = Capturer::load(Some(&model_spec), encoder, &device, dtype)?;
    let model = loaded.source();
    if model.architecture() != set.architecture {
        return Err(CliError::msg(format!(
            "the probe was trained on a {} model's states; {model_spec} is {}",
            set.architecture,
            model.architecture()
        )));
    }
    let n_layers = model.n_layers();
    let probe: &LinearProbe = match (&args.layer, args.best_layer) {
        (Some(s), _) => set.layer(one_layer(s, n_layers)?)?,
        (None, true) => set.layer(set.best_layer.ok_or_else(|| {
            CliError::msg(format!("{} marks no best layer", args.probe.display()))
        })?)?,
        (None, false) if set.probes.len() == 1 => &set.probes[0],
        (None, false) => {
            let have: Vec<String> = set.probes.iter().map(|p| p.layer.to_string()).collect();
            return Err(CliError::msg(format!(
                "{} has probes of layers {}: pick one with --layer L or --best-layer",
                args.probe.display(),
                have.join(", ")
            )));
        }
    };
    if probe.dim() != model.d_model() || probe.layer > n_layers {
        return Err(CliError::msg(format!(
            "the probe reads layer {} of a {}-wide model; {model_spec} has {} layers of width {}",
            probe.layer,
            probe.dim(),
            n_layers,
            model.d_model()
        )));
    }
    let spec = CaptureSpec {
        points: vec![(probe.layer, probe.site)],
        pool: set.pool,
    };
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| match &p.tokens {
            Some(t) => Ok(t.clone()),
            None => model.tokenize(&p.text),
        })
        .collect::<Result<_, _>>()?;
    if let Some(i) = ids.iter().position(Vec::is_empty) {
        return Err(CliError::msg(format!("text {} has no tokens", i + 1)));
    }
    let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
    let c = probe.classes.len();
    let mut probs = vec![0f32; prompts.len() * c];
    for batch in batches(&lens, args.batch_size) {
        let seqs: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
        let states = model.capture(&seqs, &spec)?;
        let p: Vec<f32> = probe.probabilities(&states[0])?.to_vec()?;
        for (k, &i) in batch.iter().enumerate() {
            probs[i * c..(i + 1) * c].copy_from_slice(&p[k * c..(k + 1) * c]);
        }
    }
    let predicted = probe::argmax_rows(&probs, c);
    match &args.output {
        Some(path) => {
            let mut f = std::io::BufWriter::new(
                std::fs::File::create(path)
                    .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?,
            );
            for (i, p) in prompts.iter().enumerate() {
                let map: serde_json::Map<String, serde_json::Value> = probe
                    .classes
                    .iter()
                    .zip(&probs[i * c..(i + 1) * c])
                    .map(|(k, v)| (k.clone(), serde_json::json!(v)))
                    .collect();
                let mut line = serde_json::json!({
                    "text": p.text,
                    "layer": probe.layer,
                    "predicted": probe.classes[predicted[i]],
                    "probabilities": map,
                });
                if let Some(id) = &p.id {
                    line["id"] = serde_json::json!(id);
                }
                writeln!(f, "{line}")
                    .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
            }
            f.flush()
                .map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
            emit(&format!(
                "read {} texts through the layer {} probe -> {}",
                prompts.len(),
                probe.layer,
                path.display()
            ))
        }
        None => {
            let mut out = String::new();
            for (i, p) in prompts.iter().enumerate() {
                writeln!(out, "{}", p.text)?;
                let mut order: Vec<usize> = (0..c).collect();
                order.sort_by(|&a, &b| probs[i * c + b].total_cmp(&probs[i * c + a]));
                for k in order {
                    writeln!(out, "  {:<16} {:.4}", probe.classes[k], probs[i * c + k])?;
                }
            }
            emit(&out)
        }
    }
}
