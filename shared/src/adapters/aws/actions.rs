//! Actions on DynamoDB: the actions table, its item shape, and the sparse index of unsent
//! actions the sweeper lists ([`shapes::ACTIONS`](super::shapes::ACTIONS)): sharded, keys
//! only, and, while it exists, the single-partition index of the release before.

use std::collections::{HashMap, HashSet, VecDeque};

use super::ddb::{self, from_body, get_s, n, opt_n, opt_s, s, Item};
use super::shapes::{
    unsent_shard, LEGACY_UNSENT_ATTRIBUTE, LEGACY_UNSENT_INDEX, UNSENT_INDEX, UNSENT_SHARDS,
    UNSENT_SHARD_ATTRIBUTE,
};
use super::tables::built;
use super::{unavailable, Aws};
use crate::core::domain::Millis;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::ActionStore;
use crate::core::records::ActionRecord;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};

/// The clause of every write that takes an action out of the sweeper's view (sent, moved
/// by a worker, retired): both index attributes, the sharded one and the legacy one (an
/// action accepted before the upgrade). Removing an absent attribute writes no index.
pub(super) const REMOVE_UNSENT: &str = "REMOVE unsent_shard, unsent";

/// Whether the action is still in one of the sweeper's indexes.
const STILL_UNSENT: &str = "attribute_exists(unsent_shard) OR attribute_exists(unsent)";

/// The fewest keys one query of a shard asks for.
const MIN_SHARD_PAGE: u32 = 16;

/// An action item's body overlaid with its mutable attributes.
pub(super) fn action_from_item(item: &Item) -> StoreResult<ActionRecord> {
    let mut a: ActionRecord = from_body(item)?;
    a.enqueued_at = opt_n(item, "enqueued_at");
    if let Some(st) = opt_s(item, "status") {
        a.status = st.parse().map_err(StoreError::Corrupt)?;
    }
    if let Some(u) = opt_n(item, "updated_at") {
        a.updated_at = u;
    }
    a.error = opt_s(item, "error").or(a.error);
    Ok(a)
}

#[async_trait]
impl ActionStore for Aws {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>> {
        self.get(&self.names.actions, &[("action_id", s(action_id))])
            .await?
            .map(|i| action_from_item(&i))
            .transpose()
    }

    async fn list_unsent(
        &self,
        claimed_before: Millis,
        limit: u32,
    ) -> StoreResult<Vec<ActionRecord>> {
        let ids = self.oldest_unsent(claimed_before, limit).await?;
        // The index is eventually consistent and holds keys only: each action is read
        // from the table, consistently, before it is trusted.
        let mut items: HashMap<String, Item> = HashMap::new();
        for item in self
            .batch_get(&self.names.actions, "action_id", &ids)
            .await?
        {
            items.insert(get_s(&item, "action_id")?.to_string(), item);
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(item) = items.get(id) {
                let a = action_from_item(item)?;
                if a.enqueued_at.is_none() {
                    out.push(a);
                }
            }
        }
        Ok(out)
    }

    async fn clear_unsent(&self, action_id: &str, now: Millis) -> StoreResult<bool> {
        let r = self
            .ddb
            .update_item()
            .table_name(&self.names.actions)
            .key("action_id", s(action_id))
            .update_expression(format!(
                "SET enqueued_at = :now, updated_at = :now {REMOVE_UNSENT}"
            ))
            .condition_expression(STILL_UNSENT)
            .expression_attribute_values(":now", n(now))
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if super::is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("UpdateItem actions (retire unsent)", &e)),
        }
    }
}

/// One listing of unsent action keys, oldest first: a shard of the sharded index, or the
/// legacy index. Read a page at a time, only as far as the merge needs.
struct Listing {
    index: &'static str,
    attribute: &'static str,
    value: String,
    /// Keys each query asks for.
    page: u32,
    /// Keys read and not merged yet, oldest first: `(created_at, action_id)`.
    read: VecDeque<(Millis, String)>,
    /// Where the next page starts: `Some(None)` before the first, `None` after the last.
    next: Option<Option<Item>>,
}

impl Listing {
    fn new(index: &'static str, attribute: &'static str, value: String, page: u32) -> Self {
        Listing {
            index,
            attribute,
            value,
            page,
            read: VecDeque::new(),
            next: Some(None),
        }
    }

    /// Every shard, then the legacy index, for a listing of the oldest `limit` keys.
    fn all(limit: u32) -> Vec<Listing> {
        let page = shard_page(limit);
        (0..UNSENT_SHARDS)
            .map(|n| Listing::new(UNSENT_INDEX, UNSENT_SHARD_ATTRIBUTE, format!("u#{n}"), page))
            .chain(std::iter::once(Listing::new(
                LEGACY_UNSENT_INDEX,
                LEGACY_UNSENT_ATTRIBUTE,
                "1".into(),
                limit.max(1),
            )))
            .collect()
    }

    /// Nothing left to merge and more to read.
    fn wants_a_page(&self) -> bool {
        self.read.is_empty() && self.next.is_some()
    }
}

/// Keys one query of a shard asks for: about twice a shard's share of `limit` (so the
/// oldest `limit` keys seldom need a second page of any shard), at least
/// [`MIN_SHARD_PAGE`], never more than `limit`.
fn shard_page(limit: u32) -> u32 {
    limit
        .div_ceil(UNSENT_SHARDS)
        .saturating_mul(2)
        .max(MIN_SHARD_PAGE)
        .min(limit)
        .max(1)
}

/// Merges keys listed oldest first into `out`, the oldest `limit`, each id once: repeatedly
/// the oldest head of any listing. Stops with `false` while a listing (which could hold an
/// older key) has nothing read and more to read: its next page comes first.
fn take_oldest(
    listings: &mut [Listing],
    out: &mut Vec<String>,
    seen: &mut HashSet<String>,
    limit: usize,
) -> bool {
    while out.len() < limit {
        if listings.iter().any(Listing::wants_a_page) {
            return false;
        }
        let oldest = listings
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.read.front().map(|k| (k, i)))
            .min()
            .map(|(_, i)| i);
        let Some((_, id)) = oldest.and_then(|i| listings[i].read.pop_front()) else {
            return true;
        };
        if seen.insert(id.clone()) {
            out.push(id);
        }
    }
    true
}

impl Aws {
    /// The ids of the oldest `limit` unsent actions accepted before `claimed_before`, oldest
    /// first, over every shard of the index and the legacy index: each shard is queried,
    /// and each page followed (`LastEvaluatedKey`) while the merge still needs it.
    async fn oldest_unsent(&self, claimed_before: Millis, limit: u32) -> StoreResult<Vec<String>> {
        let mut listings = Listing::all(limit);
        let (mut out, mut seen) = (Vec::new(), HashSet::new());
        while !take_oldest(&mut listings, &mut out, &mut seen, limit as usize) {
            // The listings that need a page, concurrently.
            let reads = listings
                .iter_mut()
                .filter(|l| l.wants_a_page())
                .map(|l| async move {
                    let (keys, next) = self.unsent_page(l, claimed_before).await?;
                    l.read.extend(keys);
                    // A page that would start where this one did (never from DynamoDB) ends
                    // the listing rather than the pass.
                    let again = next.as_ref() == l.next.as_ref().and_then(Option::as_ref);
                    l.next = next.filter(|k| !k.is_empty() && !again).map(Some);
                    StoreResult::Ok(())
                });
            futures_util::future::try_join_all(reads).await?;
        }
        Ok(out)
    }

    /// One page of a listing: its keys, oldest first, and where the next page starts.
    async fn unsent_page(
        &self,
        l: &Listing,
        claimed_before: Millis,
    ) -> StoreResult<(Vec<(Millis, String)>, Option<Item>)> {
        let r = self
            .ddb
            .query()
            .table_name(&self.names.actions)
            .index_name(l.index)
            .key_condition_expression("#p = :p AND created_at < :t")
            .expression_attribute_names("#p", l.attribute)
            .expression_attribute_values(":p", s(l.value.clone()))
            .expression_attribute_values(":t", n(claimed_before))
            .projection_expression("action_id, created_at")
            .limit(i32::try_from(l.page).unwrap_or(i32::MAX))
            .set_exclusive_start_key(l.next.clone().flatten())
            .send()
            .await;
        let o = match r {
            Ok(o) => o,
            // The legacy index is gone (dropped by the release after this one, or a table
            // created without it): nothing is left in it.
            Err(e) if l.index == LEGACY_UNSENT_INDEX && is_missing_index(&e) => {
                return Ok((Vec::new(), None));
            }
            Err(e) => {
                return Err(unavailable(&format!("Query actions.{}", l.index), &e));
            }
        };
        let mut keys = Vec::new();
        for item in o.items.unwrap_or_default() {
            let created_at = opt_n(&item, "created_at")
                .ok_or_else(|| StoreError::Corrupt("unsent action without created_at".into()))?;
            keys.push((created_at, get_s(&item, "action_id")?.to_string()));
        }
        Ok((keys, o.last_evaluated_key))
    }
}

/// A query of an index the table does not have: DynamoDB answers `ValidationException`
/// ("The table does not have the specified index"); `ResourceNotFoundException` is taken
/// the same way (a missing table fails the shards' queries anyway).
fn is_missing_index<R>(
    e: &aws_sdk_dynamodb::error::SdkError<aws_sdk_dynamodb::operation::query::QueryError, R>,
) -> bool {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    matches!(
        e.as_service_error().and_then(|se| se.code()),
        Some("ValidationException" | "ResourceNotFoundException")
    )
}

pub(super) fn action_put(table: &str, a: &ActionRecord) -> StoreResult<TransactWriteItem> {
    let mut item: Item = HashMap::from([
        ("action_id".to_string(), s(a.action_id.clone())),
        ("plan_id".to_string(), s(a.plan_id.clone())),
        ("status".to_string(), s(a.status.as_str())),
        ("created_at".to_string(), n(a.created_at)),
        ("updated_at".to_string(), n(a.updated_at)),
        ("body".to_string(), ddb::body(a)?),
    ]);
    if a.enqueued_at.is_none() {
        item.insert(UNSENT_SHARD_ATTRIBUTE.into(), s(unsent_shard(&a.action_id)));
    }
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(action_id)");
    Ok(TransactWriteItem::builder()
        .put(built(put.build())?)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids shaped like `new_id("act", ..)`'s (one millisecond's time prefix, then 12
    /// characters), fixed so the test is deterministic.
    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("act_0q2mf4h8s1{i:012}")).collect()
    }

    #[test]
    fn actions_spread_over_the_shards() {
        let mut per_shard: HashMap<String, usize> = HashMap::new();
        for id in ids(64) {
            let shard = unsent_shard(&id);
            let n: u32 = shard
                .strip_prefix("u#")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{shard}"));
            assert!(n < UNSENT_SHARDS, "{shard}");
            *per_shard.entry(shard).or_default() += 1;
        }
        // 64 actions, 16 shards: four a shard on average; no shard takes a quarter.
        assert!(per_shard.len() >= 10, "{per_shard:?}");
        assert!(per_shard.values().all(|&n| n <= 16), "{per_shard:?}");
        // The same id, the same shard: the attribute is written once and removed as is.
        assert_eq!(unsent_shard("act_x"), unsent_shard("act_x"));
    }

    #[test]
    fn every_way_out_of_the_listing_removes_both_index_attributes() {
        for attribute in [UNSENT_SHARD_ATTRIBUTE, LEGACY_UNSENT_ATTRIBUTE] {
            let removed = REMOVE_UNSENT
                .strip_prefix("REMOVE ")
                .map(|r| r.split(", ").any(|a| a == attribute));
            assert_eq!(removed, Some(true), "{REMOVE_UNSENT} removes {attribute}");
            assert!(STILL_UNSENT.contains(&format!("attribute_exists({attribute})")));
        }
    }

    #[test]
    fn a_shard_page_is_about_twice_a_shards_share() {
        assert_eq!(shard_page(1), 1);
        assert_eq!(shard_page(10), 10);
        assert_eq!(shard_page(100), 16);
        assert_eq!(shard_page(1_000), 126);
        assert_eq!(shard_page(12_800), 1_600);
        assert_eq!(shard_page(0), 1);
    }

    /// Listings read from memory a page at a time, as [`Aws::oldest_unsent`] reads them.
    fn merge(shards: &[Vec<(Millis, &str)>], page: usize, limit: usize) -> (Vec<String>, usize) {
        let mut listings: Vec<Listing> = shards
            .iter()
            .map(|_| Listing::new(UNSENT_INDEX, UNSENT_SHARD_ATTRIBUTE, String::new(), 0))
            .collect();
        let mut offsets = vec![0; shards.len()];
        let (mut out, mut seen, mut pages) = (Vec::new(), HashSet::new(), 0);
        while !take_oldest(&mut listings, &mut out, &mut seen, limit) {
            for (i, l) in listings.iter_mut().enumerate() {
                if !l.wants_a_page() {
                    continue;
                }
                pages += 1;
                let rest = &shards[i][offsets[i]..];
                let got = &rest[..page.min(rest.len())];
                offsets[i] += got.len();
                l.read
                    .extend(got.iter().map(|(t, id)| (*t, id.to_string())));
                l.next = (offsets[i] < shards[i].len()).then(|| Some(Item::new()));
            }
        }
        (out, pages)
    }

    #[test]
    fn the_merge_follows_each_listing_page_by_page_oldest_first() {
        // One crowded shard (pages of 2), one sparse, one empty; a duplicate (an action
        // listed by two indexes) counted once.
        let shards = vec![
            vec![
                (1, "a1"),
                (2, "a2"),
                (4, "a4"),
                (5, "a5"),
                (8, "a8"),
                (9, "a9"),
            ],
            vec![(3, "b3"), (5, "b5"), (9, "a9")],
            vec![],
        ];
        let (all, _) = merge(&shards, 2, 100);
        assert_eq!(
            all,
            ["a1", "a2", "b3", "a4", "a5", "b5", "a8", "a9"],
            "every page of every listing, oldest first, each id once"
        );
        let (oldest, pages) = merge(&shards, 2, 3);
        assert_eq!(oldest, ["a1", "a2", "b3"]);
        assert_eq!(pages, 4, "no page read past what the merge needed");
        let (none, pages) = merge(&shards, 2, 0);
        assert!(none.is_empty());
        assert_eq!(pages, 0);
    }
}
