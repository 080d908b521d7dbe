//! Unit tests of `config.rs` (kept apart so the module stays a readable size).

use super::*;

fn load(text: &str, env: &[(&str, &str)], flags: &[&str]) -> Result<Config, ConfigError> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    Config::from_toml_with_overrides(text, &env, &flags)
}

fn error_of(c: Config) -> String {
    c.validate().unwrap_err().to_string()
}

fn good() -> Config {
    load(
        "node_name = \"n1\"\nnode_address = \"192.168.0.11\"\n",
        &[],
        &[],
    )
    .unwrap()
}

#[test]
fn the_shipped_example_parses_to_the_defaults() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/systemd/node.toml"
    ))
    .unwrap();
    let c = load(&text, &[], &[]).unwrap();
    assert_eq!(c.bgp.as_number, 64512);
    assert_eq!(c.ipam.block_size, 26);
    assert_eq!(c.api.socket, PathBuf::from("/run/brindle/ctrl.sock"));
    assert_eq!(c.datastore.kind, "embedded");
    // The one key deploy sets on purpose (issue 14: a cluster needs the
    // host port); the daemon's own default stays off.
    assert_eq!(c.vrouter.host_port, "brindle0");
    assert_eq!(Config::default().vrouter.host_port, "");
}

#[test]
fn flags_win_over_env_which_wins_over_the_file() {
    let c = load(
        "[bgp]\nas_number = 65000\nlisten_port = 1179\n",
        &[
            ("BRINDLE_BGP_AS_NUMBER", "65001"),
            ("BRINDLE_BGP_LISTEN_PORT", "2179"),
            ("BRINDLE_DATASTORE_ENDPOINTS", "http://a:2379,http://b:2379"),
            ("PATH", "/bin"),
        ],
        &["--bgp-as-number", "65002", "--api-socket=/tmp/x.sock"],
    )
    .unwrap();
    assert_eq!(c.bgp.as_number, 65002);
    assert_eq!(c.bgp.listen_port, 2179);
    assert_eq!(c.api.socket, PathBuf::from("/tmp/x.sock"));
    assert_eq!(c.datastore.endpoints, ["http://a:2379", "http://b:2379"]);
}

#[test]
fn an_unknown_key_in_the_file_is_an_error_naming_it() {
    let e = load("[bgp]\nas_nummber = 1\n", &[], &[]).unwrap_err();
    assert!(e.to_string().contains("as_nummber"), "{e}");
}

#[test]
fn an_unknown_flag_or_variable_is_an_error() {
    let e = load("", &[], &["--bgp-asn", "1"]).unwrap_err();
    assert_eq!(e.to_string(), "unknown flag --bgp-asn");
    let e = load("", &[("BRINDLE_BGP_ASN", "1")], &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "environment variable BRINDLE_BGP_ASN: no such key"
    );
    let e = load("", &[], &["--bgp-as-number", "many"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "flag --bgp-as-number: \"many\" is not an integer"
    );
}

#[test]
fn validation_names_the_key_and_the_rule() {
    let v = good().validate().unwrap();
    assert_eq!(v.node_address, Ipv4Addr::new(192, 168, 0, 11));
    assert_eq!(v.node_name, "n1");

    let mut c = good();
    c.bgp.as_number = 23456;
    assert_eq!(
        error_of(c),
        "invalid configuration: bgp.as_number 23456: 0 and 23456 (AS_TRANS) are reserved"
    );
    let mut c = good();
    c.bgp.hold_time_secs = 2;
    assert!(error_of(c).contains("bgp.hold_time_secs 2"));
    let mut c = good();
    c.ipam.encapsulation = "gre".into();
    assert!(error_of(c).starts_with("invalid configuration: ipam.encapsulation \"gre\""));
    let mut c = good();
    c.ipam.block_size = 8;
    assert!(error_of(c).contains("ipam.block_size 8"));
    let mut c = good();
    c.datastore.kind = "etcd".into();
    assert!(error_of(c).contains("datastore.endpoints"));
    let mut c = good();
    c.node_address = "eth0".into();
    assert!(error_of(c).starts_with("invalid configuration: node_address \"eth0\""));
    let mut c = good();
    c.metrics.listen = "9091".into();
    assert!(error_of(c).contains("metrics.listen"));
    let mut c = good();
    c.datastore.prefix = "/brindle".into();
    assert!(error_of(c).contains("datastore.prefix"));
    let mut c = good();
    c.log_level = "loud".into();
    assert!(error_of(c).contains("log_level"));
    let mut c = good();
    c.log_format = "xml".into();
    assert!(error_of(c).contains("log_format \"xml\": one of text, json"));
}

#[test]
fn the_default_route_interface_is_the_up_default_with_the_lowest_metric() {
    let text = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
            eth1\t00000000\t0100A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
            eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
            eth2\t00000000\t0100A8C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
    assert_eq!(default_route_interface(text).as_deref(), Some("eth0"));
    assert_eq!(default_route_interface("Iface\tDestination\n"), None);
}

#[test]
fn the_underlay_gateway_is_a_key_a_flag_and_a_variable_and_must_be_ipv4() {
    let mut c = good();
    assert_eq!(c.validate().unwrap().underlay_gateway, None);
    c.vrouter.underlay_gateway = "10.99.0.254".into();
    assert_eq!(
        c.validate().unwrap().underlay_gateway,
        Some(Ipv4Addr::new(10, 99, 0, 254))
    );
    c.vrouter.underlay_gateway = "fe80::1".into();
    assert!(error_of(c).contains("vrouter.underlay_gateway"));
    let c = load(
        "[vrouter]\nunderlay_gateway = \"10.0.0.1\"\n",
        &[("BRINDLE_VROUTER_UNDERLAY_GATEWAY", "10.0.0.2")],
        &[],
    )
    .unwrap();
    assert_eq!(c.vrouter.underlay_gateway, "10.0.0.2");
    let c = load(
        "",
        &[("BRINDLE_VROUTER_UNDERLAY_GATEWAY", "10.0.0.2")],
        &["--vrouter-underlay-gateway", "10.0.0.3"],
    )
    .unwrap();
    assert_eq!(c.vrouter.underlay_gateway, "10.0.0.3");
}

#[test]
fn the_uplink_and_subnet_come_from_the_interface_holding_the_node_address() {
    let mut c = good();
    c.node_address = "127.0.0.1".into();
    let v = c.validate().unwrap();
    assert_eq!(v.uplink, "lo");
    assert_eq!(v.underlay_subnet, Some("127.0.0.0/8".parse().unwrap()));
    // Explicit values win.
    c.vrouter.uplink = "eth9".into();
    c.vrouter.underlay_subnet = "10.0.0.0/24".into();
    let v = c.validate().unwrap();
    assert_eq!(v.uplink, "eth9");
    assert_eq!(v.underlay_subnet, Some("10.0.0.0/24".parse().unwrap()));
}

#[test]
fn explicit_peers_come_from_the_file() {
    let c = load(
        "[[bgp.peers]]\naddress = \"10.0.0.1\"\nas_number = 65001\npassword = \"s\"\n",
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(c.bgp.peers.len(), 1);
    assert_eq!(c.bgp.peers[0].as_number, 65001);
    assert_eq!(c.bgp.peers[0].password.as_deref(), Some("s"));
}

#[test]
fn service_prefixes_are_cidrs_from_the_three_keys_with_errors_naming_the_key() {
    let c = load(
        "node_name = \"n1\"\nnode_address = \"192.168.0.11\"\n[bgp]\n\
             service_cluster_ips = [\"10.96.0.0/12\"]\n\
             service_loadbalancer_ips = [\"192.0.2.0/28\", \"10.96.0.0/12\"]\n",
        &[("BRINDLE_BGP_SERVICE_EXTERNAL_IPS", "198.51.100.0/24")],
        &[],
    )
    .unwrap();
    let v = c.validate().unwrap();
    let got: Vec<String> = v.service_prefixes.iter().map(|p| p.to_string()).collect();
    assert_eq!(got, ["10.96.0.0/12", "192.0.2.0/28", "198.51.100.0/24"]);

    let mut c = good();
    c.bgp.service_external_ips = vec!["10.1.2.3/16".into()];
    assert_eq!(
        error_of(c),
        "invalid configuration: bgp.service_external_ips \"10.1.2.3/16\": host bits set (the network is 10.1.0.0/16)"
    );
    let mut c = good();
    c.bgp.service_cluster_ips = vec!["ten".into()];
    assert_eq!(
        error_of(c),
        "invalid configuration: bgp.service_cluster_ips \"ten\": not a CIDR"
    );
}

#[test]
fn etcd_tls_files_must_exist_and_cert_and_key_come_together() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("x.pem");
    std::fs::write(&pem, "x").unwrap();
    let pem = pem.to_str().unwrap().to_owned();
    let mut c = good();
    c.datastore.kind = "etcd".into();
    c.datastore.endpoints = vec!["https://127.0.0.1:2379".into()];
    c.datastore.etcd_ca_file = "/nonexistent/ca.pem".into();
    assert_eq!(
        error_of(c.clone()),
        "invalid configuration: datastore.etcd_ca_file \"/nonexistent/ca.pem\": no such file"
    );
    c.datastore.etcd_ca_file = pem.clone();
    c.datastore.etcd_cert_file = pem.clone();
    assert!(error_of(c.clone()).contains("set both or neither"));
    c.datastore.etcd_key_file = pem;
    c.validate().unwrap();
    // The old key names are still read.
    let old = load("[datastore]\nca_file = \"/a\"\n", &[], &[]).unwrap();
    assert_eq!(old.datastore.etcd_ca_file, "/a");
}

#[test]
fn the_kubernetes_section_is_read_from_the_file_and_the_environment() {
    let c = load(
        "[datastore.kubernetes]\nenabled = true\n",
        &[(
            "BRINDLE_DATASTORE_KUBERNETES_KUBECONFIG",
            "/nonexistent/kubeconfig",
        )],
        &[],
    )
    .unwrap();
    assert!(c.datastore.kubernetes.enabled);
    assert_eq!(c.datastore.kubernetes.kubeconfig, "/nonexistent/kubeconfig");
    let mut g = good();
    g.datastore.kubernetes = c.datastore.kubernetes;
    assert_eq!(
        error_of(g.clone()),
        "invalid configuration: datastore.kubernetes.kubeconfig \"/nonexistent/kubeconfig\": no such file"
    );
    // Empty: the in-cluster service account, nothing to check here.
    g.datastore.kubernetes.kubeconfig = String::new();
    g.validate().unwrap();
    let e = load("[datastore.kubernetes]\nenable = true\n", &[], &[]).unwrap_err();
    assert!(e.to_string().contains("enable"), "{e}");
}
