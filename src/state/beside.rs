//! A read of the `state.path` file on a thread of its own, beside what is made of it: a start
//! that reads a million records and puts them in force takes the longer of the two, not their
//! sum (docs/keyscale.md).

use std::sync::mpsc;

/// How many batches may wait between the reader and what is made of them: the reader is never
/// far ahead.
const AHEAD: usize = 4;

/// `read` on a thread of its own (`tollgate-read`), each batch it hands over given to `make`
/// on this thread as it comes; `read`'s hand-over answers `false` once `make` takes no more
/// (it returned), and `read` should then stop. What `make` made and what `read` returned; a
/// panic on the reader's thread is resumed here.
pub(crate) fn read_beside<T: Send, R: Send, M>(
    read: impl FnOnce(&mut dyn FnMut(T) -> bool) -> R + Send,
    make: impl FnOnce(mpsc::IntoIter<T>) -> M,
) -> (M, R) {
    let (send, batches) = mpsc::sync_channel::<T>(AHEAD);
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("tollgate-read".into())
            .spawn_scoped(s, move || read(&mut |batch| send.send(batch).is_ok()))
            .expect("a thread to read state.path");
        let made = make(batches.into_iter());
        let read = reader
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (made, read)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_reach_the_maker_in_order_and_the_reader_stops_when_it_returns() {
        // Every batch, in order.
        let (got, sent) = read_beside(
            |hand| (0..10).take_while(|&i| hand(i)).count(),
            |b| b.collect::<Vec<_>>(),
        );
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(sent, 10);
        // The maker takes one and returns: the reader's next hand-overs fail (at most the
        // channel's room later), and it stops long before its end.
        let (first, sent) = read_beside(
            |hand| (0..1_000_000).take_while(|&i| hand(i)).count(),
            |mut b| b.next(),
        );
        assert_eq!(first, Some(0));
        assert!(sent <= 1 + AHEAD + 1, "the reader went on: {sent}");
    }

    #[test]
    fn a_panic_on_the_reader_is_resumed_on_the_caller() {
        let caught = std::panic::catch_unwind(|| {
            read_beside(
                |_: &mut dyn FnMut(u8) -> bool| panic!("the disk"),
                |b| b.count(),
            )
        });
        let panic = caught.expect_err("the reader's panic");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"the disk"));
    }
}
