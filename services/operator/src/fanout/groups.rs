//! Targets split into mover groups, as a pure function of where each target can be
//! written from ([`Reach`]) and how many more volumes each node can attach ([`NodeRoom`]).
//!
//! A group is what one mover writes: at most the node's room (its CSI attach limit minus
//! what is attached there, minus the source's claim when it is one) and at most the
//! mover's own limit. Claims the operator creates can go to any node with room: they are
//! spread evenly over every such node, so the rollout's time is bounded by the nodes'
//! aggregate write rate, and when the targets outnumber one round of rooms, the next round
//! places more groups on the same nodes (their movers wait for the attach slots the first
//! ones free). Claims in use are written on their user's node; existing claims go in groups
//! the scheduler places by their volumes; URLs attach nothing and ride along.

use std::collections::BTreeMap;

/// Where a target can be written from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Attaches no volume (a URL).
    Detached,
    /// A claim the operator creates, provisioned for the node its group is placed on.
    AnyNode,
    /// An existing claim: its volume decides the node; targets with the same key are
    /// grouped together and the scheduler places the group.
    Segment(String),
    /// A claim in use by a pod on this node: written there.
    Node(String),
}

/// How many more volumes of the targets' driver a node can attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRoom {
    /// The node's name.
    pub name: String,
    /// Free attach slots (None: the driver states no limit).
    pub free: Option<u32>,
}

/// One mover group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The node its mover is placed on (None: the scheduler places it).
    pub node: Option<String>,
    /// Target indices, ascending.
    pub targets: Vec<u32>,
}

/// Why no plan fits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No node can take one more volume.
    #[error("no schedulable node can attach another volume{why}: free attach slots or add nodes")]
    NoRoom {
        /// What was counted (for the message).
        why: String,
    },
}

/// The groups of `reach` (one entry per target, by index) over `nodes`, each at most
/// `max_per_group` targets; `source_attaches` when the source is a claim, which takes a
/// slot on every node a group runs on.
pub fn plan(
    reach: &[Reach],
    nodes: &[NodeRoom],
    max_per_group: u32,
    source_attaches: bool,
) -> Result<Vec<Group>, PlanError> {
    let max = max_per_group.max(1);
    let cap_of = |room: &NodeRoom| {
        let free = room.free.unwrap_or(u32::MAX);
        free.saturating_sub(u32::from(source_attaches)).min(max)
    };
    let mut groups = Vec::new();
    let mut any = Vec::new();
    let mut detached = Vec::new();
    let mut segments: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut pinned: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (i, r) in (0u32..).zip(reach) {
        match r {
            Reach::Detached => detached.push(i),
            Reach::AnyNode => any.push(i),
            Reach::Segment(key) => segments.entry(key).or_default().push(i),
            Reach::Node(node) => pinned.entry(node).or_default().push(i),
        }
    }
    for (node, targets) in pinned {
        for chunk in targets.chunks(max as usize) {
            groups.push(Group {
                node: Some(node.to_string()),
                targets: chunk.to_vec(),
            });
        }
    }
    if !any.is_empty() {
        let mut rooms: Vec<(&str, u32)> = nodes
            .iter()
            .map(|n| (n.name.as_str(), cap_of(n)))
            .filter(|(_, cap)| *cap > 0)
            .collect();
        if rooms.is_empty() {
            let why = if source_attaches {
                " besides the source's claim".to_string()
            } else {
                String::new()
            };
            return Err(PlanError::NoRoom { why });
        }
        rooms.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut rest = any.as_slice();
        while !rest.is_empty() {
            // Each round shares what is left evenly over the nodes (the first ones one
            // more), each node taking at most its room.
            let (n, r) = (rest.len(), rooms.len());
            for (i, &(node, cap)) in rooms.iter().enumerate() {
                let share = n / r + usize::from(i < n % r);
                let take = (cap as usize).min(share).min(rest.len());
                if take == 0 {
                    continue;
                }
                let (chunk, next) = rest.split_at(take);
                groups.push(Group {
                    node: Some(node.to_string()),
                    targets: chunk.to_vec(),
                });
                rest = next;
            }
        }
    }
    // A group the scheduler places fits on the node with the least room.
    let least = nodes
        .iter()
        .map(cap_of)
        .filter(|&c| c > 0)
        .min()
        .unwrap_or(max);
    for targets in segments.into_values() {
        for chunk in targets.chunks(least as usize) {
            groups.push(Group {
                node: None,
                targets: chunk.to_vec(),
            });
        }
    }
    let mut detached = detached.as_slice();
    if let Some(first) = groups.first_mut() {
        let take = (max as usize)
            .saturating_sub(first.targets.len())
            .min(detached.len());
        first.targets.extend_from_slice(&detached[..take]);
        first.targets.sort_unstable();
        detached = &detached[take..];
    }
    for chunk in detached.chunks(max as usize) {
        groups.push(Group {
            node: None,
            targets: chunk.to_vec(),
        });
    }
    Ok(groups)
}

/// Ascending indices as `[first, end)` ranges.
pub fn ranges(indices: &[u32]) -> Vec<[u32; 2]> {
    let mut out: Vec<[u32; 2]> = Vec::new();
    for &i in indices {
        match out.last_mut() {
            Some(last) if last[1] == i => last[1] = i + 1,
            _ => out.push([i, i + 1]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rooms(free: &[(&str, Option<u32>)]) -> Vec<NodeRoom> {
        free.iter()
            .map(|(n, f)| NodeRoom {
                name: n.to_string(),
                free: *f,
            })
            .collect()
    }

    fn sizes(groups: &[Group]) -> Vec<(Option<&str>, usize)> {
        groups
            .iter()
            .map(|g| (g.node.as_deref(), g.targets.len()))
            .collect()
    }

    #[test]
    fn new_claims_spread_evenly_over_every_node_with_room() {
        let reach = vec![Reach::AnyNode; 16];
        let nodes = rooms(&[
            ("a", Some(25)),
            ("b", Some(25)),
            ("c", Some(25)),
            ("d", Some(25)),
        ]);
        let groups = plan(&reach, &nodes, 64, false).unwrap();
        assert_eq!(
            sizes(&groups),
            [
                (Some("a"), 4),
                (Some("b"), 4),
                (Some("c"), 4),
                (Some("d"), 4)
            ]
        );
        let all: Vec<u32> = groups.iter().flat_map(|g| g.targets.clone()).collect();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn a_group_is_at_most_its_nodes_room_and_more_rounds_take_the_rest() {
        // 10 claims; node b has 2 slots left, node a 4, c none; the source takes one each.
        let reach = vec![Reach::AnyNode; 10];
        let nodes = rooms(&[("a", Some(5)), ("b", Some(3)), ("c", Some(1))]);
        let groups = plan(&reach, &nodes, 64, true).unwrap();
        assert_eq!(
            sizes(&groups),
            [
                (Some("a"), 4),
                (Some("b"), 2),
                (Some("a"), 2),
                (Some("b"), 2)
            ]
        );
        // The mover's own limit caps a node without a stated limit.
        let groups = plan(
            &vec![Reach::AnyNode; 100],
            &rooms(&[("x", None)]),
            64,
            false,
        )
        .unwrap();
        assert_eq!(sizes(&groups), [(Some("x"), 64), (Some("x"), 36)]);
    }

    #[test]
    fn the_10000_claim_rollout_over_500_nodes_of_25_slots() {
        let reach = vec![Reach::AnyNode; 10_000];
        let nodes: Vec<NodeRoom> = (0..500)
            .map(|i| NodeRoom {
                name: format!("node-{i:03}"),
                free: Some(25),
            })
            .collect();
        let groups = plan(&reach, &nodes, 64, false).unwrap();
        assert_eq!(groups.len(), 500);
        assert!(groups.iter().all(|g| g.targets.len() == 20));
        let mut used: Vec<&str> = groups.iter().filter_map(|g| g.node.as_deref()).collect();
        used.dedup();
        assert_eq!(used.len(), 500);
    }

    #[test]
    fn claims_in_use_stay_on_their_node_urls_ride_along_existing_claims_go_to_the_scheduler() {
        let reach = vec![
            Reach::Detached,
            Reach::Node("b".into()),
            Reach::Segment("zone-1".into()),
            Reach::Node("b".into()),
            Reach::Segment("zone-2".into()),
            Reach::Segment("zone-1".into()),
            Reach::Segment("zone-1".into()),
        ];
        let nodes = rooms(&[("a", Some(2)), ("b", Some(8))]);
        let groups = plan(&reach, &nodes, 64, false).unwrap();
        assert_eq!(
            groups,
            [
                Group {
                    node: Some("b".into()),
                    targets: vec![0, 1, 3]
                },
                Group {
                    node: None,
                    targets: vec![2, 5]
                },
                Group {
                    node: None,
                    targets: vec![6]
                },
                Group {
                    node: None,
                    targets: vec![4]
                },
            ]
        );
    }

    #[test]
    fn no_room_anywhere_is_an_error_that_says_why() {
        let e = plan(&[Reach::AnyNode], &rooms(&[("a", Some(1))]), 64, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no schedulable node can attach another volume besides the source's claim: free attach slots or add nodes"
        );
        assert!(plan(&[Reach::AnyNode], &[], 64, false).is_err());
        // URLs alone need no node.
        let groups = plan(&vec![Reach::Detached; 70], &[], 64, false).unwrap();
        assert_eq!(sizes(&groups), [(None, 64), (None, 6)]);
    }

    #[test]
    fn indices_become_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), [[0, 3], [5, 6], [7, 9]]);
        assert_eq!(ranges(&[]), Vec::<[u32; 2]>::new());
    }
}
