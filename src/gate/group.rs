//! Groups of gates: one shutdown for all of them, and a shared byte budget.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::budget::ByteBudget;
use super::handle::GateHandle;
use crate::end::EndReason;

/// The gates of one process or tenant: [`shutdown`](Group::shutdown) ends them all with a
/// visible reason, and an optional byte budget bounds what all their buffers hold together.
///
/// A gate joins with [`Gate::group`](crate::Gate::group) and leaves when it is released.
///
/// # The byte budget
///
/// Each gate is bounded by its own event and byte bounds; the budget bounds their sum. A chunk
/// that would take the group's buffers past the budget is refused as if the gate's own bound
/// had been reached: its generator waits (a `Coalesce` gate cannot merge either, merging adds
/// the same bytes) and its slow-consumer clock runs. A gate that holds more than its fair share
/// (the budget divided by the number of gates in the group) is refused already once the group
/// is within one fair share of the budget, so the streams holding the most wait first and the
/// last share is kept for the others; nothing is dropped. A gate that holds nothing always
/// admits one chunk, so no stream deadlocks: the group holds at most the budget plus one chunk
/// per gate. [`GroupStats`] shows the use.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::{EndReason, Gate, Group};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let group = Group::with_budget(64 * 1024 * 1024);
/// let consumer = Gate::new().group(&group).spawn(|_, mut tx| async move {
///     loop {
///         tx.send("t ".to_owned()).await?;
///         tokio::time::sleep(Duration::from_millis(5)).await;
///     }
///     #[allow(unreachable_code)]
///     Ok::<_, streamgate::SendError<String>>(())
/// });
/// let handle = consumer.handle();
///
/// // SIGTERM: every stream ends as `Shutdown` (transports write their terminal frame).
/// let report = group.shutdown(Duration::from_secs(5)).await;
/// assert_eq!((report.ended, report.released), (1, 1));
/// assert_eq!(handle.end_reason(), Some(EndReason::Shutdown));
/// # drop(consumer);
/// # }
/// ```
#[derive(Clone)]
pub struct Group {
    inner: Arc<Inner>,
}

struct Inner {
    budget: Option<Arc<ByteBudget>>,
    shutting_down: AtomicBool,
    members: Mutex<Members>,
}

#[derive(Default)]
struct Members {
    next: u64,
    handles: HashMap<u64, GateHandle>,
}

/// A gate's membership, held by its release: leaving the group is part of the release.
pub(crate) struct Membership {
    group: Weak<Inner>,
    id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        if let Some(inner) = self.group.upgrade() {
            let removed = inner.lock().handles.remove(&self.id);
            if let Some(budget) = &inner.budget {
                budget.leave();
            }
            drop(removed);
        }
    }
}

/// What [`Group::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Streams that were open and have been ended as [`EndReason::Shutdown`].
    pub ended: usize,
    /// Of those, how many were released within the grace.
    pub released: usize,
}

/// A snapshot of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// Gates in the group now (joined and not yet released).
    pub gates: usize,
    /// Bytes held by the buffers of the group's gates, if it has a budget (only then is it
    /// counted).
    pub buffered_bytes: Option<usize>,
    /// The byte budget, if any.
    pub budget: Option<usize>,
}

impl Group {
    /// A group without a byte budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, Group};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = Group::new();
    /// let (_tx, _consumer) = Gate::new().group(&group).channel::<String>();
    /// assert_eq!((group.stats().gates, group.stats().budget), (1, None));
    /// # }
    /// ```
    pub fn new() -> Self {
        Group {
            inner: Arc::new(Inner {
                budget: None,
                shutting_down: AtomicBool::new(false),
                members: Mutex::new(Members::default()),
            }),
        }
    }

    /// A group whose buffers hold at most `bytes` together (see the type's docs for what
    /// happens when it is reached). A budget of 0 is taken as 1: every gate still admits one
    /// chunk at a time.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, Group};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = Group::with_budget(1024 * 1024);
    /// let (mut tx, _consumer) = Gate::new().group(&group).channel::<String>();
    /// tx.try_send("Hello".to_owned()).unwrap();
    /// let stats = group.stats();
    /// assert_eq!((stats.buffered_bytes, stats.budget), (Some(5), Some(1024 * 1024)));
    /// # }
    /// ```
    pub fn with_budget(bytes: usize) -> Self {
        Group {
            inner: Arc::new(Inner {
                budget: Some(Arc::new(ByteBudget::new(bytes))),
                shutting_down: AtomicBool::new(false),
                members: Mutex::new(Members::default()),
            }),
        }
    }

    /// Ends every open stream of the group as [`EndReason::Shutdown`] and waits, at most
    /// `grace`, until each has been released. Gates that join afterwards end at once.
    ///
    /// Each consumer still receives the events that were waiting, then the end (an SSE
    /// transport writes its terminal `event: error` frame and closes the body), so a server's
    /// graceful shutdown is not held open by streams that heartbeats would keep alive.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use streamgate::{EndReason, Gate, Group};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = Group::new();
    /// let (mut tx, mut consumer) = Gate::new().group(&group).channel::<String>();
    /// tx.try_send("t0 ".to_owned()).unwrap();
    /// // The engine lets go of a stream's sender once the stream has ended.
    /// tokio::spawn(async move { tx.closed_owned().await });
    /// let report = group.shutdown(Duration::from_secs(5)).await;
    /// assert_eq!((report.ended, report.released), (1, 1));
    /// // The consumer gets what waited, then the end (an SSE transport writes its error frame).
    /// assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "t0 ");
    /// let error = consumer.next().await.unwrap().unwrap_err();
    /// assert_eq!(error.reason(), EndReason::Shutdown);
    /// # }
    /// ```
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let handles: Vec<GateHandle> = self.inner.lock().handles.values().cloned().collect();
        for handle in &handles {
            // An early end: never refused.
            let _ = handle.cancel_with(EndReason::Shutdown);
        }
        let all = async {
            for handle in &handles {
                handle.released().await;
            }
        };
        let _ = tokio::time::timeout(grace, all).await;
        ShutdownReport {
            ended: handles.len(),
            released: handles.iter().filter(|h| h.is_released()).count(),
        }
    }

    /// Whether [`shutdown`](Group::shutdown) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::{EndReason, Gate, Group};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = Group::new();
    /// group.shutdown(Duration::from_secs(1)).await;
    /// assert!(group.is_shutting_down());
    /// // A stream started now ends at once.
    /// let (_tx, consumer) = Gate::new().group(&group).channel::<String>();
    /// assert_eq!(consumer.handle().end_reason(), Some(EndReason::Shutdown));
    /// # }
    /// ```
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// A snapshot of the group.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::{Gate, Group};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let group = Group::with_budget(4096);
    /// let (mut tx, consumer) = Gate::new().group(&group).channel::<String>();
    /// tx.try_send("abc".to_owned()).unwrap();
    /// let stats = group.stats();
    /// assert_eq!((stats.gates, stats.buffered_bytes), (1, Some(3)));
    /// drop(consumer); // what it held is no longer counted
    /// assert_eq!(group.stats().buffered_bytes, Some(0));
    /// # drop(tx);
    /// # }
    /// ```
    pub fn stats(&self) -> GroupStats {
        let gates = self.inner.lock().handles.len();
        let budget = self.inner.budget.as_deref();
        GroupStats {
            gates,
            buffered_bytes: budget.map(ByteBudget::used),
            budget: budget.map(ByteBudget::limit),
        }
    }

    /// Adds a gate; `None` if the group is shutting down (the gate then ends at once).
    pub(crate) fn join(&self, handle: &GateHandle) -> Option<Membership> {
        let mut members = self.inner.lock();
        if self.is_shutting_down() {
            return None;
        }
        let id = members.next;
        members.next += 1;
        members.handles.insert(id, handle.clone());
        if let Some(budget) = &self.inner.budget {
            budget.join();
        }
        Some(Membership {
            group: Arc::downgrade(&self.inner),
            id,
        })
    }

    /// The group's byte budget, for a joining gate's buffer.
    pub(crate) fn shared_budget(&self) -> Option<Arc<ByteBudget>> {
        self.inner.budget.clone()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for Group {
    fn default() -> Self {
        Group::new()
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("stats", &self.stats())
            .field("shutting_down", &self.is_shutting_down())
            .finish()
    }
}
