//! The `ssls` compile step: stored ssl objects (keys decrypted with the keyring, validated as
//! APISIX's data plane validates them) become the snapshot's [`CertStore`]. A bad ssl is
//! quarantined on its own; an unchanged one keeps its compiled configs.

use std::sync::Arc;

use ferrisix_config::model::{ResourceKind, Ssl};
use ferrisix_config::state::ConfigState;
use ferrisix_config::validate;
use ferrisix_tls::{CertStore, TlsContext};

use super::accept::Quarantined;

pub(super) fn compile(
    state: &ConfigState,
    previous: &CertStore,
    ctx: &TlsContext,
    quarantine: &mut Vec<Quarantined>,
) -> Arc<CertStore> {
    let mut items: Vec<_> = state.items(ResourceKind::Ssls).collect();
    // Creation order decides between two ssls with one SNI, as APISIX's radixtree does.
    items.sort_by_key(|i| i.seq);
    let mut ssls: Vec<Ssl> = Vec::with_capacity(items.len());
    for item in items {
        match validate::ssl_from_value(&item.id, &item.value.parse(), &ctx.keyring) {
            Ok(ssl) => ssls.push(ssl),
            Err(e) => quarantine.push(Quarantined {
                kind: ResourceKind::Ssls,
                id: item.id.clone(),
                error: e.message,
                serving_previous: false,
            }),
        }
    }
    let (store, refused) = CertStore::build(&ssls, previous, ctx);
    for r in refused {
        quarantine.push(Quarantined {
            kind: ResourceKind::Ssls,
            id: r.id,
            error: r.error,
            serving_previous: false,
        });
    }
    Arc::new(store)
}
