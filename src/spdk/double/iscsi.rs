//! The double's iSCSI: portal groups, initiator groups, target nodes.

use super::*;

impl State {
    /// The iscsi methods (`call` routes them here by name).
    pub(super) fn call_iscsi(&mut self, method: &str, params: &Option<Value>) -> RpcResult {
        match method {
            "iscsi_create_portal_group" => {
                let p: CreatePortalGroup = decode(params)?;
                if self.portal_groups.contains_key(&p.tag) {
                    return e(INVALID_PARAMS);
                }
                self.portal_groups.insert(
                    p.tag,
                    json!({"tag": p.tag, "portals": p.portals, "private": false}),
                );
                Ok(json!(true))
            }
            "iscsi_delete_portal_group" | "iscsi_delete_initiator_group" => {
                let p: ByTag = decode(params)?;
                let map = if method.contains("portal") {
                    &mut self.portal_groups
                } else {
                    &mut self.initiator_groups
                };
                map.remove(&p.tag)
                    .map(|_| json!(true))
                    .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))
            }
            "iscsi_get_portal_groups" => Ok(Value::Array(self.portal_groups.values().cloned().collect())),
            "iscsi_create_initiator_group" => {
                let p: CreateInitiatorGroup = decode(params)?;
                if self.initiator_groups.contains_key(&p.tag) {
                    return e(INVALID_PARAMS);
                }
                self.initiator_groups.insert(
                    p.tag,
                    json!({"tag": p.tag, "initiators": p.initiators, "netmasks": p.netmasks}),
                );
                Ok(json!(true))
            }
            "iscsi_get_initiator_groups" => {
                Ok(Value::Array(self.initiator_groups.values().cloned().collect()))
            }
            "iscsi_create_target_node" => {
                let p: CreateTargetNode = decode(params)?;
                let name = if p.name.starts_with("iqn.") {
                    p.name.clone()
                } else {
                    format!("iqn.2016-06.io.spdk:{}", p.name)
                };
                let ok = !self.target_nodes.contains_key(&name)
                    && p.luns.iter().all(|l| self.find(&l.bdev_name).is_some())
                    && p.pg_ig_maps.iter().all(|m| {
                        self.portal_groups.contains_key(&m.pg_tag)
                            && self.initiator_groups.contains_key(&m.ig_tag)
                    });
                if !ok {
                    return e(INVALID_PARAMS);
                }
                self.target_nodes.insert(name.clone(), json!({
                    "name": name, "alias_name": p.alias_name, "pg_ig_maps": p.pg_ig_maps, "luns": p.luns,
                    "queue_depth": p.queue_depth, "disable_chap": p.disable_chap.unwrap_or(false),
                    "require_chap": p.require_chap.unwrap_or(false), "mutual_chap": false, "chap_group": 0,
                    "header_digest": false, "data_digest": false,
                }));
                Ok(json!(true))
            }
            "iscsi_delete_target_node" => {
                let p: DeleteTargetNode = decode(params)?;
                self.target_nodes
                    .remove(&p.name)
                    .map(|_| json!(true))
                    .ok_or((INVALID_PARAMS.0, INVALID_PARAMS.1.into()))
            }
            "iscsi_get_target_nodes" => Ok(Value::Array(self.target_nodes.values().cloned().collect())),
            _ => fail(-32601, "Method not found"),
        }
    }
}
