package kubeplace

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
)

// A paused record stands for the sandbox of the pod it holds, and only if
// its labels say the same: a record whose labels name another tenant or
// sandbox than its pod is no sandbox.
func TestPausedRecord(t *testing.T) {
	kc := testKubeConfig(t)
	id := "0123456789abcdef0123456789abcdef"
	p, err := renderPod(kc, kubeSandbox{ID: id, Tenant: "acme", Template: "base", Image: "img", CPUs: 1, Memory: 1 << 30,
		Network: "open", AgentKey: true, Timeout: time.Minute, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p.Metadata.CreationTimestamp = &created
	p.Status.Phase = "Running"
	again := recreated(p)
	if _, ok := again.Metadata.Annotations[kubeAnnDeadline]; ok {
		t.Error("the pod made again keeps the old deadline")
	}
	b, _ := json.Marshal(again)
	rec := func(tenant, sid string) *kube.Secret {
		return &kube.Secret{
			Metadata: kube.Meta{Labels: map[string]string{kubeLabelManaged: kubeManagedBy, kubeLabelID: sid, kubeLabelTenant: tenant, kubeLabelPaused: "true"}},
			Data:     map[string][]byte{kubePausedPodKey: b},
		}
	}
	sb, pod := pausedSandbox(rec("acme", id))
	if sb == nil || sb.ID != id || sb.State != engine.StatePaused || sb.Deadline != nil || sb.Labels[placement.LabelTenant] != "acme" || pod.Status.Phase != "" {
		t.Fatalf("paused record: %+v", sb)
	}
	if !sb.Created.Equal(created) {
		t.Errorf("a paused sandbox was created at %s, want %s, when its first pod was", sb.Created, created)
	}
	// Paused, it holds its disk, as on a host: its writable layer's
	// bound (the shim's default without the pod's annotation).
	if sb.Disk != policy.DefaultDisk {
		t.Errorf("a paused sandbox holds %d bytes of disk, want hutch's default %d", sb.Disk, policy.DefaultDisk)
	}
	again.Metadata.Annotations[kubeShimDisk] = "1g"
	if got := podSandbox(&again).Disk; got != 1<<30 {
		t.Errorf("a pod annotated %s=1g holds %d bytes of disk", kubeShimDisk, got)
	}
	// Resumed, its new pod is newer than it.
	later := created.Add(time.Hour)
	pod.Metadata.CreationTimestamp = &later
	if got := podSandbox(pod).Created; !got.Equal(created) {
		t.Errorf("a resumed sandbox was created at %s, want %s", got, created)
	}
	for _, bad := range []*kube.Secret{rec("other", id), rec("acme", "fedcba9876543210fedcba9876543210")} {
		if sb, _ := pausedSandbox(bad); sb != nil {
			t.Errorf("a record labelled %v stands for sandbox %s of %s", bad.Metadata.Labels, sb.ID, sb.Labels[placement.LabelTenant])
		}
	}
	notPaused := rec("acme", id)
	delete(notPaused.Metadata.Labels, kubeLabelPaused)
	if sb, _ := pausedSandbox(notPaused); sb != nil {
		t.Error("a Secret not labelled paused is a paused sandbox")
	}

	// A snapshot's record gives a create the pod's image, limits,
	// network and environment, and where to restore it.
	snap := &kube.Secret{
		Metadata: kube.Meta{Annotations: map[string]string{kubeAnnSnapshot: "s1", kubeAnnCheckpoint: id, kubeAnnNode: "n1"}},
		Data:     map[string][]byte{kubePausedPodKey: b, kubeAgentSecretKey: []byte("k")},
	}
	var ks kubeSandbox
	if err := fromSnapshot(&ks, snap); err != nil {
		t.Fatal(err)
	}
	if ks.Image != "img" || ks.CPUs != 1 || ks.Memory != 1<<30 || ks.Network != "open" || ks.Restore == nil ||
		*ks.Restore != (kubeRestore{Checkpoint: id, Node: "n1", Key: "k"}) {
		t.Errorf("create from snapshot: %+v (restore %+v)", ks, ks.Restore)
	}
	snap.Metadata.Annotations[kubeAnnCheckpoint] = "../x"
	if err := fromSnapshot(&ks, snap); err == nil {
		t.Error("a snapshot naming checkpoint ../x was accepted")
	}
	if a, b := snapshotSecretName("t1", "s"), snapshotSecretName("t2", "s"); a == b || len(a) > 63 {
		t.Errorf("snapshot Secret names %q, %q: want distinct per tenant, at most 63 characters", a, b)
	}
}

// What a server that died mid-operation left is found, and nothing else.
func TestKubeLeftovers(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	old, recent := now.Add(-time.Hour), now.Add(-time.Second)
	man := func(name string, extra map[string]string) kube.Meta {
		l := map[string]string{kubeLabelManaged: kubeManagedBy}
		for k, v := range extra {
			l[k] = v
		}
		return kube.Meta{Name: name, Labels: l, CreationTimestamp: &old, Annotations: map[string]string{}}
	}
	running := func(m kube.Meta) kube.Pod {
		p := kube.Pod{Metadata: m}
		p.Status.Phase = "Running"
		p.Status.ContainerStatuses = []kube.ContainerStatus{{Name: kubeContainer}}
		p.Status.ContainerStatuses[0].State.Running = &struct {
			StartedAt time.Time `json:"startedAt"`
		}{}
		return p
	}
	secret := func(m kube.Meta) kube.Secret { return kube.Secret{Metadata: m} }

	orphan := secret(man("hutch-orphan", nil))
	young := secret(man("hutch-young", nil))
	young.Metadata.CreationTimestamp = &recent
	owned := secret(man("hutch-owned", nil))
	owned.Metadata.OwnerReferences = []kube.OwnerRef{{Kind: "Pod", Name: "hutch-owned"}}
	withPod := secret(man("hutch-withpod", nil))
	snap := secret(man("hutch-snap-x", map[string]string{kubeLabelKind: kubeKindSnapshot}))
	stranger := kube.Secret{Metadata: kube.Meta{Name: "hutch-stranger", CreationTimestamp: &old}}
	pausedDone := secret(man("hutch-done", map[string]string{kubeLabelPaused: "true"}))
	pausedStuck := secret(man("hutch-stuck", map[string]string{kubeLabelPaused: "true"}))
	pausedNow := secret(man("hutch-now", map[string]string{kubeLabelPaused: "true"}))

	podWith := running(man("hutch-withpod", nil))
	done := kube.Pod{Metadata: man("hutch-done", nil)}
	done.Metadata.Annotations[kubeAnnPausing] = old.Format(time.RFC3339Nano)
	done.Status.Phase = "Failed"
	stuck := running(man("hutch-stuck", nil))
	stuck.Metadata.Annotations[kubeAnnPausing] = old.Format(time.RFC3339Nano)
	pausingNow := running(man("hutch-now", nil))
	pausingNow.Metadata.Annotations[kubeAnnPausing] = recent.Format(time.RFC3339Nano)

	secretsGone, podsGone, undo := kubeLeftovers(
		[]kube.Pod{podWith, done, stuck, pausingNow},
		[]kube.Secret{orphan, young, owned, withPod, snap, stranger, pausedDone, pausedStuck, pausedNow},
		now, 2*time.Minute)
	if !slices.Equal(secretsGone, []string{"hutch-orphan"}) {
		t.Errorf("Secrets swept: %v, want only the orphan", secretsGone)
	}
	if !slices.Equal(podsGone, []string{"hutch-done"}) {
		t.Errorf("pods swept: %v, want only the paused sandbox's ended pod", podsGone)
	}
	if len(undo) != 1 || undo[0].Metadata.Name != "hutch-stuck" {
		t.Errorf("pauses undone: %v, want only the one begun an hour ago", undo)
	}
}
