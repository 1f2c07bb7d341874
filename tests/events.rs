//! The event bus: each listener is contained on its own, and scopes filter.

use std::sync::{Arc, Mutex};

use subagents::events::{EventBus, EventScope, ScopedEvent};

#[derive(Debug, Clone, PartialEq)]
struct Ping {
    parent: Option<u32>,
    n: u32,
}

impl ScopedEvent for Ping {
    type Key = u32;

    fn scope_key(&self) -> Option<u32> {
        self.parent
    }

    fn name(&self) -> &'static str {
        "test/ping"
    }
}

#[test]
fn a_panicking_listener_does_not_starve_the_next_one() {
    let bus = EventBus::<Ping>::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let _first = bus.subscribe(EventScope::All, |_: &Ping| -> () {
        panic!("bad subscriber")
    });
    let _second = bus.subscribe(EventScope::All, move |event: &Ping| {
        sink.lock().unwrap().push(event.n)
    });
    bus.emit(&Ping { parent: None, n: 1 });
    bus.emit(&Ping { parent: None, n: 2 });
    assert_eq!(
        *seen.lock().unwrap(),
        [1, 2],
        "the second listener saw every event"
    );
}

#[test]
fn a_failing_listener_does_not_starve_the_next_one() {
    let bus = EventBus::<Ping>::new();
    let seen = Arc::new(Mutex::new(0));
    let sink = Arc::clone(&seen);
    let _first = bus.subscribe(EventScope::All, |_: &Ping| Err::<(), _>("refused"));
    let _second = bus.subscribe(EventScope::All, move |_: &Ping| *sink.lock().unwrap() += 1);
    bus.emit(&Ping { parent: None, n: 1 });
    assert_eq!(*seen.lock().unwrap(), 1);
}

#[test]
fn scoped_listeners_see_only_their_scope_and_dropping_unsubscribes() {
    let bus = EventBus::<Ping>::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let subscription = bus.subscribe(EventScope::Key(7), move |event: &Ping| {
        sink.lock().unwrap().push(event.n)
    });
    bus.emit(&Ping {
        parent: Some(7),
        n: 1,
    });
    bus.emit(&Ping {
        parent: Some(8),
        n: 2,
    });
    bus.emit(&Ping { parent: None, n: 3 });
    assert_eq!(*seen.lock().unwrap(), [1]);
    drop(subscription);
    assert_eq!(bus.listener_count(), 0);
    bus.emit(&Ping {
        parent: Some(7),
        n: 4,
    });
    assert_eq!(*seen.lock().unwrap(), [1]);
}

#[test]
fn a_listener_may_subscribe_while_being_called() {
    let bus = EventBus::<Ping>::new();
    let inner = Arc::clone(&bus);
    let _outer = bus.subscribe(EventScope::All, move |_: &Ping| {
        inner.subscribe(EventScope::All, |_: &Ping| ()).detach()
    });
    bus.emit(&Ping { parent: None, n: 1 });
    assert_eq!(bus.listener_count(), 2);
}
