//! Network policy in the control state (issue 15): `ApplyPolicy` updates
//! and the resync snapshot applied to the [`PolicyView`] the workers read
//! (all or nothing: a refused update changes nothing and the answer says
//! why), and each pod port's workload (`PortSpec.workload`), published to
//! the workers once per request.

use std::sync::Arc;

use brindle_api::framing::RemoteError;
use brindle_api::vrouter as api;

use super::{Control, Effects, invalid};
use crate::frame::PortId;
use crate::policy::PolicyView;

/// The policy part of the control state.
#[derive(Default)]
pub(super) struct PolicyControl {
    view: PolicyView,
    /// Changed since the workers last got it.
    dirty: bool,
    /// Resync snapshots refused (the Sync itself went on).
    refused_snapshots: u64,
}

impl<E: Effects> Control<E> {
    /// The policy view the workers enforce (as of the last request).
    pub fn policy(&self) -> &PolicyView {
        &self.policy.view
    }

    /// `ApplyPolicy`: 1 if applied, 0 if empty; refused (nothing changed)
    /// with the policy state's reason.
    pub(super) fn apply_policy(&mut self, update: &api::PolicyUpdate) -> Result<u64, RemoteError> {
        if update.is_empty() && update.generation <= self.policy.view.generation() {
            return Ok(0);
        }
        let view = self
            .policy
            .view
            .with_update(update)
            .map_err(|e| invalid(format!("policy update refused: {e}")))?;
        tracing::info!(
            generation = update.generation,
            programs = update.programs.len(),
            sets = update.sets.len(),
            "policy applied"
        );
        self.policy.view = view;
        self.policy.dirty = true;
        Ok(1)
    }

    /// The resync's snapshot: replaces the policy state (every flow
    /// revalidates). A snapshot the state refuses (a set id out of range,
    /// a program reading a missing set: a controller bug) does not fail
    /// the Sync: it is logged and counted (`refused_snapshots`) and the
    /// policy in force stays, as Felix keeps the rules it last programmed
    /// when a new set fails; endpoints new since then stay unpoliced until
    /// a snapshot or update applies (keeping pods starting rather than
    /// failing every CNI ADD of the node). Returns 1 if applied.
    pub(super) fn sync_policy(&mut self, snapshot: &api::PolicyUpdate) -> u64 {
        match self.policy.view.with_snapshot(snapshot) {
            Ok(view) => {
                self.policy.view = view;
                self.policy.dirty = true;
                1
            }
            Err(e) => {
                self.policy.refused_snapshots += 1;
                tracing::error!(
                    generation = snapshot.generation,
                    kept = self.policy.view.generation(),
                    refused = self.policy.refused_snapshots,
                    "policy snapshot refused, the policy in force stays: {e}"
                );
                0
            }
        }
    }

    /// Policy snapshots refused since start.
    pub fn refused_policy_snapshots(&self) -> u64 {
        self.policy.refused_snapshots
    }

    /// The workers' per-rule counters, summed (a worker that does not
    /// answer counts nothing).
    pub fn policy_stats(&self) -> Vec<api::PolicyRuleStats> {
        let snaps: Vec<_> = self.snapshots().into_iter().flatten().collect();
        crate::policy::sum_rules(snaps.iter().map(|s| s.rules.as_slice()))
            .into_iter()
            .map(|(k, c)| api::PolicyRuleStats {
                tier: k.tier,
                policy: k.policy,
                rule: k.rule,
                direction: k.direction.into(),
                action: k.action.into(),
                packets: c.packets,
                bytes: c.bytes,
            })
            .collect()
    }

    /// A port slot now holds `spec` (`None`: the slot is free).
    pub(super) fn set_port_workload(&mut self, id: PortId, spec: Option<&api::PortSpec>) {
        let key = spec
            .filter(|s| s.kind == api::PortKind::Pod)
            .and_then(|s| s.workload.clone());
        if self.policy.view.workload(id) != key.as_ref() {
            self.policy.view.set_workload(id, key);
            self.policy.dirty = true;
        }
    }

    /// Hands the workers the view if it changed.
    pub(super) fn publish_policy(&mut self) {
        if std::mem::take(&mut self.policy.dirty) {
            self.effects
                .publish_policy(Arc::new(self.policy.view.clone()));
        }
    }
}
