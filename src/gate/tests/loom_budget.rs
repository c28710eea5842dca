//! Model checks of a group's byte budget: gates that race for the group's last room, each
//! under its own lock, never take the group past the budget together.

use loom::thread;
use tokio_util::sync::CancellationToken;

use super::loom_buffer::{UNTIMED, model};
use crate::gate::budget::ByteBudget;
use crate::gate::buffer::{Buffer, Config};
use crate::gate::consumer::Consumer;
use crate::gate::sender::Sender;
use crate::sync::Arc;

/// A gate of the group behind `budget` (which it joins): its buffer, sender and consumer.
fn member(budget: &std::sync::Arc<ByteBudget>) -> (Sender<String>, Consumer<String>) {
    budget.join();
    let config = Config {
        max_events: 4,
        max_bytes: 64,
        policy: UNTIMED,
        first_id: 0,
        budget: Some(budget.clone()),
    };
    let buffer = Arc::new(Buffer::new(config, CancellationToken::new()));
    (
        Sender::new(buffer.clone(), false, false),
        Consumer::new(buffer),
    )
}

/// Three gates share 9 bytes (a fair share of 3). One holds 4, the two others 1 each; both of
/// those then try to add 2, which fits each one's share but only one of them in the budget:
/// exactly one is admitted, the group never holds more than 9, and the budget counts exactly
/// what the gates hold, to the byte, before and after two of them go.
#[test]
fn two_gates_never_take_the_group_past_its_budget_together() {
    model(|| {
        let budget = std::sync::Arc::new(ByteBudget::new(9));
        let (mut big, _big_consumer) = member(&budget);
        big.try_send("cccc".to_owned()).unwrap();
        let racers = ["a", "b"].map(|first| {
            let (mut sender, consumer) = member(&budget);
            sender.try_send(first.to_owned()).unwrap();
            (sender, consumer)
        });
        assert_eq!(budget.used(), 6);
        let [(mut left, left_consumer), (mut right, right_consumer)] = racers;
        let other = thread::spawn(move || (right.try_send("xx".to_owned()).is_ok(), right));
        let admitted_left = left.try_send("xx".to_owned()).is_ok();
        let (admitted_right, right) = other.join().unwrap();
        assert!(budget.used() <= 9, "{} bytes held", budget.used());
        assert_eq!(
            u8::from(admitted_left) + u8::from(admitted_right),
            1,
            "the last room goes to exactly one gate"
        );
        assert_eq!(budget.used(), 8);
        drop((left, left_consumer, right, right_consumer));
        assert_eq!(
            budget.used(),
            4,
            "what the gates that went held is handed back"
        );
    });
}
