//! The commit tail: what every transaction that ran guest calls does after
//! them, written once for a lone event, a batch ([`super::batch`]) and a
//! replay ([`crate::replay`]), so a fix to it reaches all three. In order:
//!
//! 1. the messages the applied events published go to the outbox, last and
//!    all at once (see `outbox::insert` on lock order);
//! 2. the host checks its own rows ([`invariants`]): every applied claim still
//!    says `done`, and a consumer's partition offset is still the one it read;
//! 3. the transaction's own last host write, the partition's next offset or
//!    the replayed dead letter's resolution, and the commit.
//!
//! A violation at 2, or a lost race at 3, rolls everything back. On
//! PostgreSQL a consumer's batch takes the three steps in one call of the
//! host's gates ([`seal`]).

use crate::db::dead_letters;
use crate::db::inbox::Claim;
use crate::db::invariants::{self, Position};
use crate::db::offsets::{self, Advance};
use crate::db::outbox::{self, NewMessage};
use crate::db::seal::{self, Sealing};
use crate::db::{DbError, Tx};

/// The host's last write in the transaction, besides the guest's work.
pub enum End<'a> {
    /// A consumer's: the partition moves past the transaction's records.
    Advance(Advance<'a>),
    /// A consumer's with key order: the partition's offset is not this
    /// transaction's to move (its task raises it, see `kafka::keyed`), so
    /// only the claims are checked.
    Claims,
    /// A replay's: dead letter `letter` resolved as `replayed`. A replay
    /// does not move the partition's offset (a consumer may be running), so
    /// only its claim is checked.
    Resolve { letter: i64, claim: &'a Claim<'a> },
}

/// How the transaction ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Sealed {
    Committed,
    /// The host's rows were not as it left them; everything was rolled back.
    Violation(String),
    /// Someone else wrote the end first (another consumer committed the
    /// partition, another replay resolved the letter); everything was
    /// rolled back.
    Raced,
}

/// Ends `tx`, in which the events `applied` (by id) were applied by their
/// handler `handler` and published `messages`. With nothing applied (only
/// duplicates or parks), steps 1 and 2 have nothing to do.
pub async fn seal(
    mut tx: Tx,
    handler: &str,
    applied: &[String],
    messages: &[NewMessage],
    end: End<'_>,
) -> Result<Sealed, DbError> {
    debug_assert!(
        messages.is_empty() || !applied.is_empty(),
        "messages come from applied calls"
    );
    // PostgreSQL: steps 1 to 3 of a consumer's batch in one call.
    if !applied.is_empty()
        && let End::Advance(advance) = &end
        && let Some(sealing) = seal::tail(&mut tx, handler, messages, applied, advance).await?
    {
        return Ok(match sealing {
            Sealing::Advanced => {
                tx.commit().await?;
                Sealed::Committed
            }
            Sealing::Violation(violation) => {
                tx.rollback().await?;
                Sealed::Violation(violation)
            }
            Sealing::Raced => {
                tx.rollback().await?;
                Sealed::Raced
            }
        });
    }
    if !applied.is_empty() {
        outbox::insert(&mut tx, handler, messages).await?;
        let violation = match &end {
            End::Advance(advance) => {
                invariants::violation(&mut tx, &Position::from(advance), applied).await?
            }
            End::Resolve { claim, .. } => invariants::claim_violation(&mut tx, claim).await?,
            End::Claims => invariants::claims_violation(&mut tx, handler, applied).await?,
        };
        if let Some(violation) = violation {
            tx.rollback().await?;
            return Ok(Sealed::Violation(violation));
        }
    }
    let won = match &end {
        End::Advance(advance) => offsets::advance(&mut tx, advance).await?,
        End::Resolve { letter, .. } => dead_letters::resolve(&mut tx, *letter, "replayed").await?,
        End::Claims => true,
    };
    if !won {
        tx.rollback().await?;
        return Ok(Sealed::Raced);
    }
    tx.commit().await?;
    Ok(Sealed::Committed)
}
