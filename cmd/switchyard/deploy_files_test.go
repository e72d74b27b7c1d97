package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"switchyard/config"
)

// Checks of deploy/ that need no running router: the alert rules' structure (and promtool's
// verdict when it is installed), the dashboard's queries (through promtool), the Kubernetes
// manifests' consistency with each other, with the Dockerfile and with the configuration
// schema.

// dashboardQuery is one PromQL expression of the dashboard and where it is.
type dashboardQuery struct{ where, expr string }

// dashboardVariable is a label_values(selector, label) variable.
type dashboardVariable struct {
	where, expr     string // expr is the selector
	selector, label string
}

type dashboardFile struct {
	exprs     []dashboardQuery
	variables []dashboardVariable
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// loadDashboard reads a Grafana dashboard's queries and query variables.
func loadDashboard(t *testing.T, path string) dashboardFile {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out dashboardFile
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out.exprs = append(out.exprs, dashboardQuery{p.Title, tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Fatalf("variable %s: query %v is not label_values(selector, label)", v.Name, v.Query)
		}
		pq, err := parsePromQL(m[1])
		if err != nil || len(pq.selectors) != 1 {
			t.Fatalf("variable %s: %q: %v", v.Name, m[1], err)
		}
		out.variables = append(out.variables, dashboardVariable{where: v.Name, expr: m[1], selector: pq.selectors[0].name, label: m[2]})
	}
	return out
}

// alertRule is one rule of a Prometheus rule file.
type alertRule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// loadAlertRules decodes a rule file strictly (an unknown key is an error, as Prometheus
// makes it) and returns its rules.
func loadAlertRules(t *testing.T, path string) []alertRule {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name     string      `yaml:"name"`
			Interval string      `yaml:"interval"`
			Limit    int         `yaml:"limit"`
			Rules    []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(f.Groups) == 0 {
		t.Fatalf("%s: no rule groups", path)
	}
	var rules []alertRule
	groups := map[string]bool{}
	for _, g := range f.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("%s: group name %q empty or repeated", path, g.Name)
		}
		groups[g.Name] = true
		rules = append(rules, g.Rules...)
	}
	return rules
}

// promDuration is Prometheus's duration syntax (a Go duration does not allow d, w, y).
var promDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)

// templateLabel finds {{ $labels.NAME }} in an annotation.
var templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// TestAlertRulesStructure: every rule is an alert with a query, a Prometheus duration, a
// severity the routing knows, and a summary and description.
func TestAlertRulesStructure(t *testing.T) {
	rules := loadAlertRules(t, filepath.Join(deployDir(t), "prometheus", "alerts.yaml"))
	want := []string{"SwitchyardNoHealthyEngine", "SwitchyardBreakerOpen", "SwitchyardHighErrorRate", "SwitchyardKVEventLag"}
	names := map[string]bool{}
	for _, r := range rules {
		if r.Alert == "" || r.Record != "" {
			t.Errorf("rule %q/%q: only alerting rules belong here", r.Alert, r.Record)
		}
		if names[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		names[r.Alert] = true
		if _, err := parsePromQL(r.Expr); err != nil {
			t.Errorf("alert %s: %v", r.Alert, err)
		}
		if r.For != "" && !promDuration.MatchString(r.For) {
			t.Errorf("alert %s: for %q is not a Prometheus duration", r.Alert, r.For)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("alert %s: a summary and a description are required", r.Alert)
		}
	}
	for _, n := range want {
		if !names[n] {
			t.Errorf("no %s alert", n)
		}
	}
}

// alertOutputLabels are the labels an alert's series carry: its grouping labels when it
// aggregates, else the labels of its metrics and the target's.
func alertOutputLabels(exposed exposition, expr string) map[string]bool {
	q, _ := parsePromQL(expr)
	out := map[string]bool{}
	if len(q.grouping) > 0 {
		for _, l := range q.grouping {
			out[l] = true
		}
		return out
	}
	for _, l := range targetLabels {
		out[l] = true
	}
	for _, s := range q.selectors {
		for l := range exposed[s.name] {
			out[l] = true
		}
	}
	return out
}

// promtool returns the path of promtool, or skips the test (fails it under CI=true).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found: CI checks the alert rules with it (Debian: apt-get install prometheus)")
		}
		t.Skip("SKIPPED: promtool not found, the alert rules and dashboard queries are not checked by Prometheus's own parser (Debian: apt-get install prometheus)")
	}
	return p
}

func runPromtool(t *testing.T, bin, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRulesPromtool: Prometheus's own checker accepts the rules, their unit tests
// (alerts_test.yaml) pass, and every dashboard query parses.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	dir := filepath.Join(deployDir(t), "prometheus")
	runPromtool(t, bin, dir, "check", "rules", "alerts.yaml")
	runPromtool(t, bin, dir, "test", "rules", "alerts_test.yaml")

	// The dashboard's queries as recording rules, Grafana's variables replaced by values.
	vars := strings.NewReplacer("$__rate_interval", "5m", "${datasource}", "x", "$instance", ".*", "$model", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	d := loadDashboard(t, filepath.Join(deployDir(t), "grafana", "switchyard.json"))
	for i, e := range d.exprs {
		expr := vars.Replace(e.expr)
		if strings.Contains(expr, "$") {
			t.Errorf("panel %q: unknown variable in %q", e.where, e.expr)
		}
		fmt.Fprintf(&b, "      - record: dashboard:query_%d\n        expr: %s\n", i, strconv.Quote(expr))
	}
	tmp := t.TempDir()
	if err := os.WriteFile(filepath.Join(tmp, "dashboard.yaml"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, bin, tmp, "check", "rules", "dashboard.yaml")
}

// k8sObject is the part of a Kubernetes object every check reads.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	file string
	raw  []byte
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Resources struct {
		Limits map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	LivenessProbe  k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe k8sProbe `yaml:"readinessProbe"`
	StartupProbe   k8sProbe `yaml:"startupProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sDeployment struct {
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				ServiceAccountName            string `yaml:"serviceAccountName"`
				AutomountToken                *bool  `yaml:"automountServiceAccountToken"`
				TerminationGracePeriodSeconds int    `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
					RunAsGroup   int  `yaml:"runAsGroup"`
				} `yaml:"securityContext"`
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// k8sManifests is deploy/kubernetes, parsed.
type k8sManifests struct {
	objects   []k8sObject
	kustomize struct {
		Namespace string
		Resources []string
	}
	deployment k8sDeployment
}

func (m *k8sManifests) byKind(t *testing.T, kind string) k8sObject {
	t.Helper()
	var found []k8sObject
	for _, o := range m.objects {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(found), kind)
	}
	return found[0]
}

func (m *k8sManifests) container(t *testing.T) k8sContainer {
	t.Helper()
	cs := m.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	return cs[0]
}

// loadManifests reads every YAML document of dir but the kustomization.
func loadManifests(t *testing.T, dir string) *k8sManifests {
	t.Helper()
	m := &k8sManifests{}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			if err := yaml.Unmarshal(raw, &m.kustomize); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			continue
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var node yaml.Node
			err := dec.Decode(&node)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			doc, err := yaml.Marshal(&node)
			if err != nil {
				t.Fatal(err)
			}
			o := k8sObject{file: filepath.Base(f), raw: doc}
			if err := node.Decode(&o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: a document without apiVersion, kind or name", f)
			}
			m.objects = append(m.objects, o)
			if o.Kind == "Deployment" {
				if err := node.Decode(&m.deployment); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
			}
		}
	}
	return m
}

// TestKubernetesManifests: the manifests agree with each other, with the Dockerfile and with
// the configuration schema (the ConfigMap's configuration is what `switchyard check` accepts).
func TestKubernetesManifests(t *testing.T) {
	dir := filepath.Join(deployDir(t), "kubernetes")
	m := loadManifests(t, dir)

	// kustomization: every manifest listed once, every namespaced object in its namespace.
	files := map[string]bool{}
	for _, o := range m.objects {
		files[o.file] = true
		if o.Kind != "Namespace" && o.Metadata.Namespace != m.kustomize.Namespace {
			t.Errorf("%s %s: namespace %q, kustomization's %q", o.Kind, o.Metadata.Name, o.Metadata.Namespace, m.kustomize.Namespace)
		}
	}
	listed := slices.Sorted(func(yield func(string) bool) {
		for f := range files {
			if !yield(f) {
				return
			}
		}
	})
	if got := slices.Sorted(slices.Values(m.kustomize.Resources)); !slices.Equal(got, listed) {
		t.Errorf("kustomization resources %v, files %v", got, listed)
	}
	if ns := m.byKind(t, "Namespace"); ns.Metadata.Name != m.kustomize.Namespace {
		t.Errorf("namespace %s, kustomization's %s", ns.Metadata.Name, m.kustomize.Namespace)
	}

	// RBAC: the service account the Deployment runs as may get, list and watch pods.
	sa := m.byKind(t, "ServiceAccount")
	spec := m.deployment.Spec.Template.Spec
	if spec.ServiceAccountName != sa.Metadata.Name {
		t.Errorf("deployment runs as %q, service account %q", spec.ServiceAccountName, sa.Metadata.Name)
	}
	var role struct {
		Rules []struct {
			APIGroups []string `yaml:"apiGroups"`
			Resources []string `yaml:"resources"`
			Verbs     []string `yaml:"verbs"`
		} `yaml:"rules"`
	}
	roleObj := m.byKind(t, "Role")
	if err := yaml.Unmarshal(roleObj.raw, &role); err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) != 1 || fmt.Sprint(role.Rules[0].APIGroups) != "[]" || fmt.Sprint(role.Rules[0].Resources) != "[pods]" ||
		fmt.Sprint(role.Rules[0].Verbs) != "[get list watch]" {
		t.Errorf("role rules %+v, want pods get/list/watch in the core group", role.Rules)
	}
	var binding struct {
		RoleRef  struct{ Kind, Name string } `yaml:"roleRef"`
		Subjects []struct{ Kind, Name, Namespace string }
	}
	if err := yaml.Unmarshal(m.byKind(t, "RoleBinding").raw, &binding); err != nil {
		t.Fatal(err)
	}
	if binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != roleObj.Metadata.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Kind != "ServiceAccount" || binding.Subjects[0].Name != sa.Metadata.Name ||
		binding.Subjects[0].Namespace != sa.Metadata.Namespace {
		t.Errorf("role binding %+v does not bind role %s to service account %s/%s", binding, roleObj.Metadata.Name, sa.Metadata.Namespace, sa.Metadata.Name)
	}

	// The configuration: valid, listening on every interface on the container's port.
	var cm struct{ Data map[string]string }
	cmObj := m.byKind(t, "ConfigMap")
	if err := yaml.Unmarshal(cmObj.raw, &cm); err != nil {
		t.Fatal(err)
	}
	c := m.container(t)
	mount := ""
	for _, vm := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap.Name == cmObj.Metadata.Name {
				mount = vm.MountPath
			}
		}
	}
	if mount == "" {
		t.Fatalf("the container does not mount config map %s", cmObj.Metadata.Name)
	}
	if len(c.Args) != 3 || c.Args[0] != "serve" || c.Args[1] != "--config" || !strings.HasPrefix(c.Args[2], mount+"/") {
		t.Fatalf("container args %q, want serve --config %s/<key>", c.Args, mount)
	}
	key := strings.TrimPrefix(c.Args[2], mount+"/")
	text, ok := cm.Data[key]
	if !ok {
		t.Fatalf("config map %s has no key %s", cmObj.Metadata.Name, key)
	}
	cfgPath := filepath.Join(t.TempDir(), key)
	if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCmd(t, "check", "--config", cfgPath); code != 0 {
		t.Fatalf("switchyard check of the config map's %s: exit %d\n%s%s", key, code, out, errOut)
	}
	cfg, err := config.Load([]string{"--config", cfgPath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.Host != "0.0.0.0" {
		t.Errorf("server.host %q: a pod must listen on 0.0.0.0", cfg.Server.Host)
	}
	var httpPort int
	for _, p := range c.Ports {
		if p.Name == "http" {
			httpPort = p.ContainerPort
		}
	}
	if httpPort == 0 || httpPort != cfg.Server.Port {
		t.Errorf("container port http %d, server.port %d", httpPort, cfg.Server.Port)
	}

	// Kubernetes discovery: in-cluster, in the namespace the Role is bound in, with the
	// service account's token mounted.
	if k := cfg.Discovery.Kubernetes; k.Enabled {
		if k.Kubeconfig != "" {
			t.Errorf("discovery.kubernetes.kubeconfig %q: a pod uses its service account", k.Kubeconfig)
		}
		if k.Namespace == "" || k.Namespace != roleObj.Metadata.Namespace {
			t.Errorf("discovery.kubernetes.namespace %q, the Role is bound in %q (every namespace needs a ClusterRole)",
				k.Namespace, roleObj.Metadata.Namespace)
		}
		var saDoc struct {
			AutomountToken *bool `yaml:"automountServiceAccountToken"`
		}
		if err := yaml.Unmarshal(sa.raw, &saDoc); err != nil {
			t.Fatal(err)
		}
		pod := spec.AutomountToken
		if !(pod != nil && *pod || pod == nil && (saDoc.AutomountToken == nil || *saDoc.AutomountToken)) {
			show := func(b *bool) string {
				if b == nil {
					return "unset"
				}
				return strconv.FormatBool(*b)
			}
			t.Errorf("discovery is on but the service account token is not mounted (automountServiceAccountToken: pod %s, service account %s)",
				show(pod), show(saDoc.AutomountToken))
		}
	}

	// Probes, scraping and the Service use the router's port.
	for name, p := range map[string]k8sProbe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p.HTTPGet.Port != "http" || p.HTTPGet.Path == "" {
			t.Errorf("%s probe %+v, want a path on port http", name, p.HTTPGet)
		}
	}
	ann := m.deployment.Spec.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(cfg.Server.Port) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", ann)
	}
	var svc struct {
		Spec struct {
			Selector map[string]string
			Ports    []struct {
				Name       string
				TargetPort string `yaml:"targetPort"`
			}
		}
	}
	if err := yaml.Unmarshal(m.byKind(t, "Service").raw, &svc); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != "http" {
		t.Errorf("service ports %+v, want one targeting http", svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if m.deployment.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("service selects %s=%s, the pods do not carry it", k, v)
		}
	}
	for k, v := range m.deployment.Spec.Selector.MatchLabels {
		if m.deployment.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("deployment selects %s=%s, its pods do not carry it", k, v)
		}
	}

	// Shutdown: the kubelet waits for the preStop pause and the drain.
	grace := time.Duration(spec.TerminationGracePeriodSeconds) * time.Second
	pause := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	if grace <= cfg.Server.DrainTimeout+pause {
		t.Errorf("terminationGracePeriodSeconds %v <= drain_timeout %v + preStop %v", grace, cfg.Server.DrainTimeout, pause)
	}

	// The image: its default command is the Deployment's; non-root as the image's user,
	// read-only root, no escalation.
	user, cmd := dockerfile(t)
	if !slices.Equal(cmd, c.Args) {
		t.Errorf("Dockerfile CMD %q, Deployment args %q", cmd, c.Args)
	}
	sc := spec.SecurityContext
	if !sc.RunAsNonRoot || fmt.Sprintf("%d:%d", sc.RunAsUser, sc.RunAsGroup) != user {
		t.Errorf("pod security context %+v, image user %s", sc, user)
	}
	if !c.SecurityContext.ReadOnlyRootFilesystem || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("container security context %+v", c.SecurityContext)
	}

	// GOMEMLIMIT below the memory limit.
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			if lim, limit := quantityBytes(t, e.Value), quantityBytes(t, c.Resources.Limits["memory"]); lim <= 0 || lim >= limit {
				t.Errorf("GOMEMLIMIT %s not below limits.memory %s", e.Value, c.Resources.Limits["memory"])
			}
		}
	}
}

// quantityBytes reads a binary-suffixed size (Kubernetes Mi/Gi, Go's MiB/GiB).
func quantityBytes(t *testing.T, s string) int64 {
	t.Helper()
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"Gi", 1 << 30}, {"Mi", 1 << 20}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("size %q: %v", s, err)
			}
			return n * u.mult
		}
	}
	t.Fatalf("size %q: unknown unit", s)
	return 0
}

// dockerfile checks the Dockerfile's final stage (an empty base, the router as entry point,
// a user that is not root) and returns its USER and CMD.
func dockerfile(t *testing.T) (user string, cmd []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir(t), "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var from, entry, cmdJSON string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		rest := strings.TrimSpace(strings.TrimPrefix(line, f[0]))
		switch strings.ToUpper(f[0]) {
		case "FROM":
			from, user, entry, cmdJSON = rest, "", "", "" // a new stage
		case "USER":
			user = rest
		case "ENTRYPOINT":
			entry = rest
		case "CMD":
			cmdJSON = rest
		}
	}
	if from != "scratch" && !strings.Contains(from, "distroless") {
		t.Errorf("final stage FROM %s, want scratch or distroless", from)
	}
	if entry != `["/usr/local/bin/switchyard"]` {
		t.Errorf("ENTRYPOINT %s", entry)
	}
	if err := json.Unmarshal([]byte(cmdJSON), &cmd); err != nil {
		t.Errorf("CMD %s: %v", cmdJSON, err)
	}
	if user == "" || strings.HasPrefix(user, "0") || user == "root" {
		t.Errorf("USER %q: the router must not run as root", user)
	}
	return user, cmd
}
