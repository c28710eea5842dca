//! How a fake provider chooses each request's [`Behaviour`]: always the same, a queue (the
//! first attempts fail, the rest succeed), per model, or any function of the [`Attempt`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::attempt::Attempt;
use super::behaviour::Behaviour;

/// Chooses the behaviour of each request from what was received ([`Attempt::number`],
/// `model`, path, body...). Cheap to clone: clones share their state (a queue's place).
#[derive(Clone)]
pub struct Script(Arc<dyn Fn(&Attempt) -> Behaviour + Send + Sync>);

impl Script {
    /// `behaviour` for every request.
    pub fn always(behaviour: Behaviour) -> Script {
        Script::from_fn(move |_| behaviour.clone())
    }

    /// The n-th request this script is asked about gets `first`'s n-th behaviour, and every
    /// request after them `then` (`queue([status(500)], ok())`: 500 once, then OK).
    pub fn queue(first: impl IntoIterator<Item = Behaviour>, then: Behaviour) -> Script {
        let first: Vec<Behaviour> = first.into_iter().collect();
        let asked = AtomicUsize::new(0);
        Script::from_fn(move |_| {
            let n = asked.fetch_add(1, Ordering::SeqCst);
            first.get(n).unwrap_or(&then).clone()
        })
    }

    /// Requests for a model of `models` follow its script (a queue there counts that model's
    /// requests only); any other request (or one without a model) follows `otherwise`.
    pub fn per_model<'a>(
        models: impl IntoIterator<Item = (&'a str, Script)>,
        otherwise: Script,
    ) -> Script {
        let models: HashMap<String, Script> = models
            .into_iter()
            .map(|(model, script)| (model.to_owned(), script))
            .collect();
        Script::from_fn(move |attempt| {
            let script = attempt.model.as_ref().and_then(|model| models.get(model));
            script.unwrap_or(&otherwise).answer(attempt)
        })
    }

    /// `choose`'s behaviour for each request.
    pub fn from_fn(choose: impl Fn(&Attempt) -> Behaviour + Send + Sync + 'static) -> Script {
        Script(Arc::new(choose))
    }

    /// The behaviour of `attempt`.
    pub fn answer(&self, attempt: &Attempt) -> Behaviour {
        (self.0)(attempt)
    }
}

impl From<Behaviour> for Script {
    fn from(behaviour: Behaviour) -> Script {
        Script::always(behaviour)
    }
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Script")
    }
}
