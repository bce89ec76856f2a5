//! A Redis Cluster: connecting to it, and the nodes this process reached before (so that a
//! restart of the node in `redis_url` does not leave the gateway without the others).

use redis::{RedisError, RedisResult};

use super::{no_delay, Client, StoreError};
use crate::config::{at_address, Cluster};
use crate::sync::Locked;

/// A connection to the Redis Cluster `cfg` names, starting from its URL and the nodes `known`
/// (URLs); the nodes it has now are remembered for the next.
pub(super) async fn cluster(cfg: &Cluster, known: Vec<String>) -> Result<Client, StoreError> {
    let url = cfg.redis_url.as_str();
    let fail = |e: RedisError| StoreError::of(&e, url);
    let t = cfg.timeout;
    let mut initial = vec![url.to_string()];
    initial.extend(known.into_iter().filter(|k| k != url));
    let cluster = redis::cluster::ClusterClient::builder(initial)
        .connection_timeout(t)
        .response_timeout(t)
        .retries(0)
        .tcp_settings(no_delay())
        .build()
        .map_err(fail)?;
    let mut conn = cluster.get_async_connection().await.map_err(fail)?;
    let nodes: RedisResult<String> = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await;
    if let Ok(nodes) = nodes {
        remember_nodes(url, &nodes);
    }
    Ok(Client::Cluster(conn))
}

/// The nodes of each Redis Cluster this process reached, by the URL it was configured with,
/// as URLs with that URL's credentials and database.
static CLUSTER_NODES: std::sync::Mutex<Vec<(String, Vec<String>)>> =
    std::sync::Mutex::new(Vec::new());

pub(super) fn known_nodes(url: &str) -> Vec<String> {
    let known = CLUSTER_NODES.locked();
    known
        .iter()
        .find(|(u, _)| u == url)
        .map(|(_, nodes)| nodes.clone())
        .unwrap_or_default()
}

/// Keep the addresses `CLUSTER NODES` lists (`<id> <ip:port@bus> <flags> ...`, nodes marked
/// failed or without an address left out), as URLs like `url`.
fn remember_nodes(url: &str, listing: &str) {
    let nodes: Vec<String> = listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let addr = fields.nth(1)?.split(['@', ',']).next()?;
            let flags = fields.next()?;
            if flags.contains("fail") || flags.contains("noaddr") {
                return None;
            }
            at_address(url, addr)
        })
        .collect();
    if nodes.is_empty() {
        return;
    }
    let mut known = CLUSTER_NODES.locked();
    known.retain(|(u, _)| u != url);
    known.push((url.to_string(), nodes));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_nodes_are_remembered_as_urls_with_the_credentials() {
        let url = "redis://:pw@10.0.0.1:7000/0";
        remember_nodes(
            url,
            "a1 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
             b2 10.0.0.2:7001@17001,host-b master - 0 0 2 connected 5461-10922\n\
             c3 10.0.0.3:7002@17002 master,fail - 0 0 3 disconnected\n\
             d4 :0@0 slave,noaddr - 0 0 3 disconnected\n",
        );
        assert_eq!(
            known_nodes(url),
            ["redis://:pw@10.0.0.1:7000/0", "redis://:pw@10.0.0.2:7001/0"]
        );
        assert!(known_nodes("redis://other:1").is_empty());
    }
}
