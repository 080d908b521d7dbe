use super::*;
use serde_json::{Map, Value, json};

fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

const ADD_ENV: &[(&str, &str)] = &[
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "abc123"),
    ("CNI_NETNS", "/var/run/netns/x"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    (
        "CNI_ARGS",
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1",
    ),
];

#[test]
fn config_keeps_unknown_fields_and_reads_the_known_ones() {
    let conf = NetConf::parse(
        br#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"brindle","mtu":1400,
            "futureKey":{"a":1},
            "ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/24"}]]},
            "runtimeConfig":{"portMappings":[]},
            "prevResult":{"cniVersion":"1.0.0"}}"#,
    )
    .unwrap();
    assert_eq!(conf.version().unwrap(), CniVersion::V1_0_0);
    assert_eq!(conf.plugin_type, "brindle");
    assert_eq!(conf.extra["mtu"], json!(1400));
    assert_eq!(conf.extra["futureKey"], json!({"a":1}));
    let ipam = conf.ipam.as_ref().unwrap();
    assert_eq!(ipam.plugin_type, "host-local");
    assert!(ipam.extra.contains_key("ranges"));
    assert!(conf.runtime_config.unwrap().contains_key("portMappings"));
    assert!(conf.prev_result.is_some());
}

#[test]
fn config_errors_carry_the_spec_codes() {
    let code = |s: &[u8]| NetConf::parse(s).unwrap_err().code;
    assert_eq!(code(b"{not json"), ErrorCode::DECODE_FAILURE);
    assert_eq!(
        code(br#"{"cniVersion":"0.2.0","name":"n","type":"t"}"#),
        ErrorCode::INCOMPATIBLE_VERSION
    );
    assert_eq!(
        code(br#"{"cniVersion":"1.0.0","name":"","type":"t"}"#),
        ErrorCode::INVALID_CONFIG
    );
    assert_eq!(
        code(br#"{"cniVersion":"1.0.0","name":"-bad","type":"t"}"#),
        ErrorCode::INVALID_CONFIG
    );
    assert_eq!(
        code(br#"{"cniVersion":"1.0.0","name":"n"}"#),
        ErrorCode::INVALID_CONFIG
    );
    assert_eq!(
        code(br#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{"type":"../x"}}"#),
        ErrorCode::INVALID_CONFIG
    );
}

#[test]
fn gc_attachments_merge_the_current_and_the_older_key() {
    let conf = NetConf::parse(
        br#"{"cniVersion":"1.1.0","name":"n","type":"t",
            "cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],
            "cni.dev/attachments":[{"containerID":"b","ifname":"eth0"},{"containerID":"a","ifname":"eth0"}]}"#,
    )
    .unwrap();
    let all = conf.gc_valid_attachments().unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].container_id, "b");
    let none = NetConf::parse(br#"{"cniVersion":"1.1.0","name":"n","type":"t"}"#).unwrap();
    assert_eq!(none.gc_valid_attachments(), None);
}

fn sample_result() -> CniResult {
    CniResult {
        interfaces: vec![
            Interface {
                name: "bri0123456789a".into(),
                mac: "ee:ee:ee:ee:ee:ee".into(),
                ..Default::default()
            },
            Interface {
                name: "eth0".into(),
                mac: "02:00:00:00:00:01".into(),
                mtu: Some(1450),
                sandbox: "/var/run/netns/x".into(),
                ..Default::default()
            },
        ],
        ips: vec![
            IpConfig {
                address: "10.1.0.5/32".parse().unwrap(),
                gateway: Some("169.254.1.1".parse().unwrap()),
                interface: Some(1),
            },
            IpConfig {
                address: "fd00::5/128".parse().unwrap(),
                gateway: None,
                interface: Some(1),
            },
        ],
        routes: vec![Route {
            dst: "0.0.0.0/0".parse().unwrap(),
            gw: Some("169.254.1.1".parse().unwrap()),
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: Some(0),
        }],
        dns: Dns {
            nameservers: vec!["10.96.0.10".into()],
            ..Default::default()
        },
    }
}

#[test]
fn results_before_1_0_0_carry_ip_versions_and_no_new_fields() {
    let v = sample_result().to_json(CniVersion::V0_3_1);
    assert_eq!(v["cniVersion"], "0.3.1");
    assert_eq!(v["ips"][0]["version"], "4");
    assert_eq!(v["ips"][1]["version"], "6");
    assert_eq!(v["ips"][0]["interface"], 1);
    assert!(v["interfaces"][1].get("mtu").is_none());
    assert!(v["routes"][0].get("scope").is_none());
    assert_eq!(v["dns"]["nameservers"][0], "10.96.0.10");
}

#[test]
fn results_from_1_0_0_drop_ip_versions_and_1_1_0_adds_mtu_and_scope() {
    let v100 = sample_result().to_json(CniVersion::V1_0_0);
    assert!(v100["ips"][0].get("version").is_none());
    assert!(v100["interfaces"][1].get("mtu").is_none());
    let v110 = sample_result().to_json(CniVersion::V1_1_0);
    assert_eq!(v110["interfaces"][1]["mtu"], 1450);
    assert_eq!(v110["routes"][0]["scope"], 0);
    assert_eq!(v110["interfaces"][0]["name"], "bri0123456789a");
    assert!(v110["interfaces"][0].get("sandbox").is_none());
}

#[test]
fn results_round_trip_through_every_version() {
    for from in CniVersion::ALL {
        let wire = sample_result().to_json(from);
        let (v, parsed) = CniResult::from_json(&wire).unwrap();
        assert_eq!(v, from);
        for to in CniVersion::ALL {
            let again = CniResult::from_json(&parsed.to_json(to)).unwrap().1;
            if from >= CniVersion::V1_1_0 && to >= CniVersion::V1_1_0 {
                assert_eq!(again, sample_result());
            } else {
                assert_eq!(again.ips, sample_result().ips);
                assert_eq!(again.interfaces.len(), 2);
            }
        }
    }
}

#[test]
fn results_of_unknown_versions_or_bad_indexes_are_refused() {
    let old = json!({"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.1/24"}});
    assert_eq!(
        CniResult::from_json(&old).unwrap_err().code,
        ErrorCode::INCOMPATIBLE_VERSION
    );
    let bad = json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/24","interface":3}]});
    assert_eq!(
        CniResult::from_json(&bad).unwrap_err().code,
        ErrorCode::DECODE_FAILURE
    );
}

#[test]
fn error_json_has_code_msg_and_details() {
    let e = CniError::try_again_later("node daemon not ready")
        .with_details("connect: No such file")
        .in_version("1.0.0");
    let v: Value = serde_json::from_str(&e.to_json()).unwrap();
    assert_eq!(
        v,
        json!({"cniVersion":"1.0.0","code":11,"msg":"node daemon not ready","details":"connect: No such file"})
    );
    let bare: Value =
        serde_json::from_str(&CniError::new(ErrorCode::IO_FAILURE, "x").to_json()).unwrap();
    assert!(bare.get("details").is_none());
    assert_eq!(bare["cniVersion"], SPEC_VERSION);
}

#[test]
fn environment_is_validated_per_verb() {
    let env = CniEnv::from_vars(vars(ADD_ENV)).unwrap();
    assert_eq!(env.command, Command::Add);
    assert_eq!(env.path.len(), 2);
    assert_eq!(env.args.pod_namespace(), Some("default"));
    assert_eq!(env.args.pod_name(), Some("web-0"));
    assert_eq!(env.args.pod_uid(), Some("u-1"));
    assert_eq!(env.args.pod_infra_container_id(), None);

    let no_netns: Vec<_> = ADD_ENV
        .iter()
        .copied()
        .filter(|(k, _)| *k != "CNI_NETNS")
        .collect();
    let e = CniEnv::from_vars(vars(&no_netns)).unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT);
    let mut del = no_netns.clone();
    del[0] = ("CNI_COMMAND", "DEL");
    assert!(CniEnv::from_vars(vars(&del)).unwrap().netns.is_none());

    let gc = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")];
    assert!(CniEnv::from_vars(vars(&gc)).is_ok());
    for (k, bad) in [
        ("CNI_IFNAME", "a-very-long-name0"),
        ("CNI_IFNAME", "eth/0"),
        ("CNI_CONTAINERID", "a b"),
        ("CNI_ARGS", "novalue"),
        ("CNI_COMMAND", "ATTACH"),
    ] {
        let mut bent: Vec<_> = ADD_ENV.to_vec();
        bent.iter_mut().find(|(n, _)| *n == k).unwrap().1 = bad;
        let e = CniEnv::from_vars(vars(&bent)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT, "{k}={bad}");
    }
}

#[test]
fn environment_round_trips_for_delegation() {
    let env = CniEnv::from_vars(vars(ADD_ENV)).unwrap();
    let passed = env.to_vars();
    let again = CniEnv::from_vars(|k| passed.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .unwrap();
    assert_eq!(again, env);
}

struct Fake;
impl Plugin for Fake {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        if req.env.container_id == "fail" {
            return Err(CniError::try_again_later("not ready"));
        }
        Ok(sample_result())
    }
    fn del(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn check(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn status(&self, _: &Request) -> Result<(), CniError> {
        Err(CniError::new(ErrorCode::PLUGIN_NOT_AVAILABLE, "down"))
    }
}

fn with_command<'a>(cmd: &'a str, id: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut v = ADD_ENV.to_vec();
    v[0].1 = cmd;
    v[1].1 = id;
    v
}

#[test]
fn driver_writes_the_result_in_the_configs_version() {
    let env = with_command("ADD", "c1");
    let out = dispatch(
        &Fake,
        vars(&env),
        br#"{"cniVersion":"0.4.0","name":"n","type":"brindle"}"#,
    );
    assert_eq!(out.exit_code, 0);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["ips"][0]["version"], "4");
}

#[test]
fn driver_reports_errors_as_json_with_the_configs_version() {
    let env = with_command("ADD", "fail");
    let out = dispatch(
        &Fake,
        vars(&env),
        br#"{"cniVersion":"1.0.0","name":"n","type":"brindle"}"#,
    );
    assert_eq!(out.exit_code, 1);
    let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (e.code, e.cni_version.as_str()),
        (ErrorCode::TRY_AGAIN_LATER, "1.0.0")
    );
}

#[test]
fn driver_refuses_verbs_the_version_does_not_have() {
    for (cmd, version) in [("CHECK", "0.3.1"), ("GC", "1.0.0"), ("STATUS", "0.4.0")] {
        let env = with_command(cmd, "c1");
        let conf = format!(r#"{{"cniVersion":"{version}","name":"n","type":"brindle"}}"#);
        let out = dispatch(&Fake, vars(&env), conf.as_bytes());
        let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(e.code, ErrorCode::INCOMPATIBLE_VERSION, "{cmd} {version}");
    }
    let env = with_command("STATUS", "c1");
    let out = dispatch(
        &Fake,
        vars(&env),
        br#"{"cniVersion":"1.1.0","name":"n","type":"brindle"}"#,
    );
    let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e.code, ErrorCode::PLUGIN_NOT_AVAILABLE);
}

#[test]
fn driver_answers_version_without_a_config() {
    let env = [("CNI_COMMAND", "VERSION")];
    let out = dispatch(&Fake, vars(&env), b"");
    assert_eq!(out.exit_code, 0);
    let v: VersionInfo = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, VersionInfo::brindle());
    assert_eq!(v.supported_versions, ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
}

#[test]
fn driver_maps_a_missing_command_to_code_4() {
    let out = dispatch(&Fake, vars(&[]), b"{}");
    let e: CniError = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e.code, ErrorCode::INVALID_ENVIRONMENT);
    assert_eq!(out.exit_code, 1);
}

#[test]
fn conflist_builds_each_plugins_config_like_a_runtime() {
    let list: NetConfList = serde_json::from_value(json!({
        "cniVersion":"1.0.0","name":"k8s",
        "plugins":[{"type":"brindle"},{"type":"portmap","capabilities":{"portMappings":true}}]
    }))
    .unwrap();
    let rc: Map<String, Value> =
        serde_json::from_value(json!({"portMappings":[{"hostPort":8080}],"bandwidth":{}})).unwrap();
    let first = list.plugin_conf(0, &rc, None).unwrap();
    assert_eq!(
        first,
        json!({"type":"brindle","cniVersion":"1.0.0","name":"k8s"})
    );
    let prev = json!({"cniVersion":"1.0.0"});
    let second = list.plugin_conf(1, &rc, Some(&prev)).unwrap();
    assert_eq!(
        second["runtimeConfig"],
        json!({"portMappings":[{"hostPort":8080}]})
    );
    assert_eq!(second["prevResult"], prev);
    assert!(list.plugin_conf(2, &rc, None).is_none());
}
