//! The fleet as configured: pools of upstreams, the models each serves (names or globs), model
//! fallbacks, and the attempts' limits, from `--upstream` flags or a `--config` TOML file (and
//! `--fallbacks` JSON), checked before the proxy starts.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use streamgate::fleet::{AttemptOptions, CircuitOptions};
use wildmatch::WildMatch;

use super::url::UpstreamUrl;

/// The fleet, checked: at least one pool, none empty, every fallback served by a pool, no
/// fallback cycle.
#[derive(Debug, Clone)]
pub struct Routes {
    /// The pools, in the order a request's model is matched against them.
    pub pools: Vec<PoolConfig>,
    /// For a model, the models to fall back to, in order (already followed through: `a -> b`
    /// and `b -> c` make `a`'s `[b, c]`).
    pub fallbacks: BTreeMap<String, Vec<String>>,
    /// For a model, the larger-context models to try when a request does not fit its context.
    pub context_fallbacks: BTreeMap<String, Vec<String>>,
    /// How many attempts a request may make, in how long.
    pub attempts: AttemptOptions,
}

/// One pool: replicas serving the same models.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Its name, for `/stats`, `/metrics` and errors.
    pub name: String,
    /// The models it serves: names or globs (`*`, `?`).
    pub models: Vec<String>,
    /// Its replicas and their weights.
    pub upstreams: Vec<(UpstreamUrl, u32)>,
    /// A path to `GET` on every replica every `interval`, ejecting one that fails it.
    pub health: Option<(String, Duration)>,
    /// When a replica (or a model on it) is ejected, and for how long.
    pub circuits: CircuitOptions,
    /// Whether its servers continue a final assistant message (a continuation's prefix): vLLM,
    /// TGI and llama.cpp do; a pool that does not (`prefill = false`: SGLang, some hosted
    /// models) is never asked to continue a stream, only to restart one.
    pub prefill: bool,
}

impl PoolConfig {
    /// Whether it serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.models
            .iter()
            .any(|pattern| WildMatch::new(pattern).matches(model))
    }
}

/// The TOML file (`--config`), as written. A commented example: `cli/examples/fleet.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "pool")]
    pools: Vec<PoolFile>,
    #[serde(default)]
    fallbacks: BTreeMap<String, OneOrMore>,
    #[serde(default)]
    context_fallbacks: BTreeMap<String, OneOrMore>,
    #[serde(default)]
    attempts: AttemptsFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    name: String,
    #[serde(default = "every_model")]
    models: Vec<String>,
    upstreams: Vec<UpstreamFile>,
    health_path: Option<String>,
    health_interval_ms: Option<u64>,
    failures: Option<u32>,
    cooldown_ms: Option<u64>,
    max_cooldown_ms: Option<u64>,
    #[serde(default = "accepts_prefill")]
    prefill: bool,
}

fn accepts_prefill() -> bool {
    true
}

fn every_model() -> Vec<String> {
    vec!["*".to_owned()]
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum UpstreamFile {
    Url(String),
    Weighted { url: String, weight: u32 },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttemptsFile {
    max: Option<u32>,
    deadline_ms: Option<u64>,
    backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
}

/// A fallback: one model, or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMore {
    One(String),
    More(Vec<String>),
}

impl OneOrMore {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMore::One(model) => vec![model],
            OneOrMore::More(models) => models,
        }
    }
}

/// The default health probe interval.
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// The longest health probe interval (a day).
const MAX_HEALTH_INTERVAL: Duration = Duration::from_secs(86_400);

impl Routes {
    /// One pool of `upstreams` (replicas of weight 1) serving every model: the flags' fleet.
    pub fn of_upstreams(upstreams: &[UpstreamUrl], attempts: AttemptOptions) -> Self {
        Routes {
            pools: vec![PoolConfig {
                name: "default".to_owned(),
                models: every_model(),
                upstreams: upstreams.iter().map(|url| (url.clone(), 1)).collect(),
                health: None,
                circuits: CircuitOptions::default(),
                prefill: accepts_prefill(),
            }],
            fallbacks: BTreeMap::new(),
            context_fallbacks: BTreeMap::new(),
            attempts,
        }
    }

    /// The fleet a `--config` file describes (its `[attempts]` over `attempts`).
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not TOML of this shape, or describes a fleet [`check`]
    /// refuses.
    ///
    /// [`check`]: Routes::check
    pub fn from_toml(path: &Path, attempts: AttemptOptions) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("--config {}: {error}", path.display()))?;
        let file: File = toml::from_str(&text)
            .map_err(|error| format!("--config {}: {error}", path.display()))?;
        let mut pools = Vec::new();
        for pool in file.pools {
            let upstreams = pool
                .upstreams
                .into_iter()
                .map(|upstream| {
                    let (url, weight) = match upstream {
                        UpstreamFile::Url(url) => (url, 1),
                        UpstreamFile::Weighted { url, weight } => (url, weight),
                    };
                    let url = url
                        .parse::<UpstreamUrl>()
                        .map_err(|why| format!("pool `{}`: {why}", pool.name))?;
                    Ok((url, weight.max(1)))
                })
                .collect::<Result<Vec<_>, String>>()?;
            let mut circuits = CircuitOptions::default();
            if let Some(failures) = pool.failures {
                circuits = circuits.failures(failures);
            }
            if let Some(ms) = pool.cooldown_ms {
                circuits = circuits.cooldown(Duration::from_millis(ms));
            }
            if let Some(ms) = pool.max_cooldown_ms {
                circuits = circuits.max_cooldown(Duration::from_millis(ms));
            }
            let interval = pool
                .health_interval_ms
                .map_or(HEALTH_INTERVAL, Duration::from_millis);
            if interval.is_zero() || interval > MAX_HEALTH_INTERVAL {
                return Err(format!(
                    "pool `{}`: health_interval_ms must be between 1 and {}",
                    pool.name,
                    MAX_HEALTH_INTERVAL.as_millis()
                ));
            }
            if let Some(path) = &pool.health_path {
                if !path.starts_with('/') {
                    return Err(format!(
                        "pool `{}`: health_path `{path}` must start with /",
                        pool.name
                    ));
                }
            }
            pools.push(PoolConfig {
                name: pool.name,
                models: pool.models,
                upstreams,
                health: pool.health_path.map(|path| (path, interval)),
                circuits,
                prefill: pool.prefill,
            });
        }
        let options = file.attempts;
        let mut attempts = attempts;
        if let Some(max) = options.max {
            attempts = attempts.max_attempts(max);
        }
        if let Some(ms) = options.deadline_ms {
            attempts = attempts.deadline(Duration::from_millis(ms));
        }
        if options.backoff_ms.is_some() || options.max_backoff_ms.is_some() {
            let first = Duration::from_millis(options.backoff_ms.unwrap_or(100));
            let max = Duration::from_millis(options.max_backoff_ms.unwrap_or(2_000));
            attempts = attempts.backoff(first, max);
        }
        let list = |map: BTreeMap<String, OneOrMore>| {
            map.into_iter()
                .map(|(model, to)| (model, to.into_vec()))
                .collect::<BTreeMap<_, _>>()
        };
        Routes {
            pools,
            fallbacks: list(file.fallbacks),
            context_fallbacks: list(file.context_fallbacks),
            attempts,
        }
        .check()
    }

    /// Adds the fallbacks of a `--fallbacks` JSON file (`{"gpt-x": "gpt-y", "big": ["medium",
    /// "small"]}`) to those of the configuration.
    ///
    /// # Errors
    ///
    /// The file cannot be read or parsed, names a model the configuration already gives
    /// fallbacks for, or makes a fleet [`check`](Routes::check) refuses.
    pub fn with_fallbacks_file(mut self, path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("--fallbacks {}: {error}", path.display()))?;
        let map: BTreeMap<String, OneOrMore> = serde_json::from_str(&text).map_err(|error| {
            format!(
                "--fallbacks {}: not a JSON object of models to a model or a list of models: \
                 {error}",
                path.display()
            )
        })?;
        for (model, to) in map {
            if self.fallbacks.contains_key(&model) {
                return Err(format!(
                    "--fallbacks {}: `{model}` has fallbacks in --config too",
                    path.display()
                ));
            }
            self.fallbacks.insert(model, to.into_vec());
        }
        self.check()
    }

    /// The fleet if it can serve: at least one pool, each with a name of its own and at least
    /// one upstream, every fallback served by some pool, and fallbacks that lead nowhere they
    /// came from; each model's fallbacks followed through (`a -> b -> c` gives `a` `[b, c]`).
    ///
    /// # Errors
    ///
    /// What is wrong, naming the pool or the model.
    pub fn check(mut self) -> Result<Self, String> {
        if self.pools.is_empty() {
            return Err(
                "no pool: give --upstream URL (one or more), or a --config with a [[pool]]".into(),
            );
        }
        let mut names = HashSet::new();
        for pool in &self.pools {
            if pool.upstreams.is_empty() {
                return Err(format!("pool `{}` has no upstream", pool.name));
            }
            if pool.models.is_empty() {
                return Err(format!("pool `{}` serves no model", pool.name));
            }
            if !names.insert(pool.name.clone()) {
                return Err(format!("two pools are named `{}`", pool.name));
            }
        }
        for map in [&self.fallbacks, &self.context_fallbacks] {
            for model in map.values().flatten() {
                if !self.pools.iter().any(|pool| pool.serves(model)) {
                    return Err(format!("fallback `{model}`: no pool serves it"));
                }
            }
        }
        let followed = self
            .fallbacks
            .keys()
            .map(|model| Ok((model.clone(), follow(&self.fallbacks, model)?)))
            .collect::<Result<BTreeMap<_, _>, String>>()?;
        self.fallbacks = followed;
        Ok(self)
    }

    /// The pool that serves `model`: the first whose models match it.
    pub fn pool_for(&self, model: &str) -> Option<usize> {
        self.pools.iter().position(|pool| pool.serves(model))
    }
}

/// `model`'s fallbacks followed through, depth first, each once.
///
/// # Errors
///
/// A fallback that leads back to a model on its own way (`a -> b -> a`).
fn follow(fallbacks: &BTreeMap<String, Vec<String>>, model: &str) -> Result<Vec<String>, String> {
    fn visit(
        fallbacks: &BTreeMap<String, Vec<String>>,
        model: &str,
        path: &mut Vec<String>,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        for next in fallbacks.get(model).into_iter().flatten() {
            if path.iter().any(|seen| seen == next) {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Err(format!("fallback cycle: {}", cycle.join(" -> ")));
            }
            if !out.contains(next) {
                out.push(next.clone());
            }
            path.push(next.clone());
            visit(fallbacks, next, path, out)?;
            path.pop();
        }
        Ok(())
    }
    let mut out = Vec::new();
    visit(fallbacks, model, &mut vec![model.to_owned()], &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile_path::Temp {
        tempfile_path::Temp::new(text)
    }

    /// A file in the temp dir, removed when dropped.
    mod tempfile_path {
        pub struct Temp(pub std::path::PathBuf);

        impl Temp {
            pub fn new(text: &str) -> Temp {
                use std::sync::atomic::{AtomicU64, Ordering};
                static N: AtomicU64 = AtomicU64::new(0);
                let name = format!(
                    "streamgate-routes-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                );
                let path = std::env::temp_dir().join(name);
                std::fs::write(&path, text).unwrap();
                Temp(path)
            }
        }

        impl Drop for Temp {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn a_config_file_describes_pools_models_and_fallbacks() {
        let file = write(
            r#"
            [[pool]]
            name = "big"
            models = ["llama-70b*", "big"]
            upstreams = ["http://10.0.0.1:8000", { url = "https://gpu-2/openai/v1", weight = 3 }]
            health_path = "/health"
            failures = 2

            [[pool]]
            name = "small"
            models = ["small", "tiny"]
            upstreams = ["10.0.0.3:8000"]
            prefill = false

            [fallbacks]
            big = ["small"]
            small = "tiny"

            [attempts]
            max = 5
            "#,
        );
        let routes = Routes::from_toml(&file.0, AttemptOptions::default()).unwrap();
        assert_eq!(routes.pools.len(), 2);
        assert_eq!(routes.pools[0].upstreams[1].1, 3);
        assert_eq!(
            routes.pools[0].upstreams[1].0.to_string(),
            "https://gpu-2:443/openai/v1"
        );
        assert_eq!(routes.pool_for("llama-70b-instruct"), Some(0));
        assert_eq!(routes.pool_for("tiny"), Some(1));
        assert_eq!(routes.pool_for("gpt-4"), None);
        assert_eq!(
            routes.fallbacks["big"],
            ["small", "tiny"],
            "followed through"
        );
        assert_eq!(
            routes.pools[0].health.as_ref().map(|(p, _)| p.as_str()),
            Some("/health")
        );
        assert_eq!(routes.attempts, AttemptOptions::default().max_attempts(5));
        assert!(routes.pools[0].prefill, "by default");
        assert!(!routes.pools[1].prefill);
    }

    #[test]
    fn the_commented_example_is_a_fleet() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fleet.toml");
        let routes = Routes::from_toml(&path, AttemptOptions::default()).unwrap();
        assert_eq!(routes.pools.len(), 3);
        assert_eq!(routes.pool_for("llama-3.1-70b-instruct"), Some(0));
        assert_eq!(routes.pool_for("llama-3.1-8b-128k"), Some(1));
        assert_eq!(routes.pool_for("small"), Some(2));
        assert_eq!(routes.fallbacks["big"], ["small"]);
        assert_eq!(routes.context_fallbacks["small"], ["llama-3.1-8b-128k"]);
        // Its "default" values are the defaults.
        assert_eq!(routes.attempts, AttemptOptions::default());
        assert_eq!(routes.pools[0].circuits, CircuitOptions::default());
        assert_eq!(
            routes.pools[0].health,
            Some(("/health".to_owned(), HEALTH_INTERVAL))
        );
    }

    #[test]
    fn a_fleet_that_cannot_serve_is_refused_with_the_reason() {
        let refused = |text: &str| {
            let file = write(text);
            Routes::from_toml(&file.0, AttemptOptions::default()).unwrap_err()
        };
        assert!(refused("").contains("no pool"));
        assert!(refused("[[pool]]\nname = \"p\"\nupstreams = []\n").contains("has no upstream"));
        assert!(refused("[[pool]]\nname = \"p\"\nupstreams = [\"ftp://x\"]\n").contains("ftp://x"));
        assert!(
            refused("[[pool]]\nname = \"p\"\n").contains("upstreams"),
            "missing field"
        );
        assert!(
            refused("[[pool]]\nname = \"p\"\nupstreams = [\"a:1\"]\nweight = 2\n")
                .contains("weight")
        );
        let two = "[[pool]]\nname = \"p\"\nupstreams = [\"a:1\"]\n[[pool]]\nname = \"p\"\nupstreams = [\"b:1\"]\n";
        assert!(refused(two).contains("two pools are named `p`"));
        let pool = "[[pool]]\nname = \"p\"\nmodels = [\"a\", \"b\"]\nupstreams = [\"a:1\"]\n";
        let cycle = format!("{pool}[fallbacks]\na = \"b\"\nb = [\"a\"]\n");
        assert!(
            refused(&cycle).contains("fallback cycle: a -> b -> a"),
            "{}",
            refused(&cycle)
        );
        let nowhere = format!("{pool}[fallbacks]\na = \"c\"\n");
        assert!(refused(&nowhere).contains("fallback `c`: no pool serves it"));
        assert!(refused("not toml at all [").contains("--config"));
        let never = "[[pool]]\nname = \"p\"\nupstreams = [\"a:1\"]\nhealth_path = \"/h\"\nhealth_interval_ms = 0\n";
        assert!(
            refused(never).contains("health_interval_ms"),
            "{}",
            refused(never)
        );
    }

    #[test]
    fn a_fallbacks_file_adds_to_the_flags_fleet() {
        let upstreams = ["http://a:1".parse::<UpstreamUrl>().unwrap()];
        let routes = Routes::of_upstreams(&upstreams, AttemptOptions::default());
        let file = write(r#"{"gpt-x": "gpt-y", "big": ["medium", "small"]}"#);
        let routes = routes.with_fallbacks_file(&file.0).unwrap();
        assert_eq!(routes.fallbacks["big"], ["medium", "small"]);
        let bad = write(r#"["not", "an", "object"]"#);
        let upstreams = ["http://a:1".parse::<UpstreamUrl>().unwrap()];
        let error = Routes::of_upstreams(&upstreams, AttemptOptions::default())
            .with_fallbacks_file(&bad.0)
            .unwrap_err();
        assert!(error.contains("not a JSON object"), "{error}");
        assert!(
            Routes::of_upstreams(&[], AttemptOptions::default())
                .check()
                .is_err()
        );
    }
}
