//! The MAC a runtime asks the pod's interface to have (issue 14 item 7):
//! `MAC=` in `CNI_ARGS` (the key the reference plugins read, e.g. a
//! runtime's network reload that keeps the pod's MAC), overridden by
//! `runtimeConfig.mac` (the `mac` capability), in the tuning plugin's
//! order. ADD makes the pod's interface with it, so the node daemon, the
//! vrouter and the host's neighbour entry know the pod's MAC from the
//! start instead of a random one changed behind them.

use brindle_api::cni::{CniError, Request};
use brindle_api::vrouter::Mac;

/// The requested MAC, if any. A malformed, multicast or all-zero MAC is
/// refused (a pod cannot send from it).
pub fn requested_mac(req: &Request) -> Result<Option<[u8; 6]>, CniError> {
    let from_args = req.env.args.get("MAC").filter(|m| !m.is_empty());
    let from_runtime = req
        .conf
        .runtime_config
        .as_ref()
        .and_then(|rc| rc.get("mac"))
        .and_then(|m| m.as_str())
        .filter(|m| !m.is_empty());
    let Some(text) = from_runtime.or(from_args) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        let msg = format!("MAC {text:?}: {why}");
        if from_runtime.is_some() {
            CniError::invalid_config(msg)
        } else {
            CniError::invalid_env(msg)
        }
    };
    let Mac(mac) = text.parse().map_err(|e: String| bad(&e))?;
    if mac[0] & 1 != 0 {
        return Err(bad("multicast"));
    }
    if mac == [0; 6] {
        return Err(bad("all zero"));
    }
    Ok(Some(mac))
}

#[cfg(test)]
mod tests {
    use brindle_api::cni::{CniEnv, ErrorCode, NetConf};

    use super::*;

    fn request(args: &str, runtime_mac: Option<&str>) -> Request {
        let vars = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/p"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", args),
        ];
        let env = CniEnv::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        let runtime = runtime_mac
            .map(|m| format!(r#","runtimeConfig":{{"mac":"{m}"}}"#))
            .unwrap_or_default();
        let stdin = format!(r#"{{"cniVersion":"1.0.0","name":"net","type":"brindle"{runtime}}}"#);
        let conf = NetConf::parse(stdin.as_bytes()).unwrap();
        Request {
            version: conf.version().unwrap(),
            env,
            conf,
            stdin: stdin.into_bytes(),
        }
    }

    #[test]
    fn cni_args_mac_is_the_pods_mac_and_runtime_config_overrides_it() {
        assert_eq!(
            requested_mac(&request("K8S_POD_NAME=web", None)).unwrap(),
            None
        );
        assert_eq!(
            requested_mac(&request("IgnoreUnknown=1;MAC=02:42:AC:11:00:07", None)).unwrap(),
            Some([0x02, 0x42, 0xac, 0x11, 0x00, 0x07])
        );
        assert_eq!(
            requested_mac(&request(
                "IgnoreUnknown=1;MAC=02:42:ac:11:00:07",
                Some("02:00:00:00:00:09")
            ))
            .unwrap(),
            Some([2, 0, 0, 0, 0, 9])
        );
        // An empty value asks for nothing.
        assert_eq!(requested_mac(&request("MAC=", None)).unwrap(), None);
    }

    #[test]
    fn a_malformed_multicast_or_zero_mac_is_refused_with_the_right_code() {
        for (args, runtime, code) in [
            ("MAC=02:42:ac:11:00", None, ErrorCode::INVALID_ENVIRONMENT),
            (
                "MAC=01:00:5e:00:00:01",
                None,
                ErrorCode::INVALID_ENVIRONMENT,
            ),
            (
                "MAC=00:00:00:00:00:00",
                None,
                ErrorCode::INVALID_ENVIRONMENT,
            ),
            ("", Some("zz:00:00:00:00:01"), ErrorCode::INVALID_CONFIG),
        ] {
            let e = requested_mac(&request(args, runtime)).unwrap_err();
            assert_eq!(e.code, code, "{args} {runtime:?}: {e:?}");
        }
    }
}
