package kube

import "time"

// Pod is the part of a core/v1 Pod that hutch serve writes and reads.
type Pod struct {
	APIVersion string    `json:"apiVersion,omitempty"`
	Kind       string    `json:"kind,omitempty"`
	Metadata   Meta      `json:"metadata"`
	Spec       PodSpec   `json:"spec"`
	Status     PodStatus `json:"status,omitempty"`
}

// Meta is an object's metadata.
type Meta struct {
	Name              string            `json:"name,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
	CreationTimestamp *time.Time        `json:"creationTimestamp,omitempty"`
	DeletionTimestamp *time.Time        `json:"deletionTimestamp,omitempty"`
	OwnerReferences   []OwnerRef        `json:"ownerReferences,omitempty"`
}

// OwnerRef names the object another one belongs to: the cluster's
// garbage collector deletes it with its owner.
type OwnerRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
}

// PodSpec is a pod's spec.
type PodSpec struct {
	RuntimeClassName              string      `json:"runtimeClassName,omitempty"`
	RestartPolicy                 string      `json:"restartPolicy,omitempty"`
	AutomountServiceAccountToken  *bool       `json:"automountServiceAccountToken,omitempty"`
	EnableServiceLinks            *bool       `json:"enableServiceLinks,omitempty"`
	TerminationGracePeriodSeconds *int64      `json:"terminationGracePeriodSeconds,omitempty"`
	NodeName                      string      `json:"nodeName,omitempty"`
	Containers                    []Container `json:"containers"`
}

// Container is one container of a pod.
type Container struct {
	Name            string       `json:"name"`
	Image           string       `json:"image"`
	ImagePullPolicy string       `json:"imagePullPolicy,omitempty"`
	Command         []string     `json:"command,omitempty"`
	Env             []EnvVar     `json:"env,omitempty"`
	Resources       Resources    `json:"resources"`
	Stdin           bool         `json:"stdin,omitempty"`
	SecurityContext *SecurityCtx `json:"securityContext,omitempty"`
}

// SecurityCtx is a container's security context.
type SecurityCtx struct {
	AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation,omitempty"`
}

// EnvVar is one environment variable: Value, or a key of a Secret.
type EnvVar struct {
	Name      string     `json:"name"`
	Value     string     `json:"value"`
	ValueFrom *EnvSource `json:"valueFrom,omitempty"`
}

// EnvSource is where a variable's value comes from.
type EnvSource struct {
	SecretKeyRef *KeyRef `json:"secretKeyRef,omitempty"`
}

// KeyRef is one key of a Secret.
type KeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// Resources are a container's requests and limits (quantities as
// strings: "1", "512Mi").
type Resources struct {
	Requests map[string]string `json:"requests,omitempty"`
	Limits   map[string]string `json:"limits,omitempty"`
}

// PodStatus is what the kubelet reports of a pod.
type PodStatus struct {
	Phase   string `json:"phase,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	PodIP   string `json:"podIP,omitempty"`
	// HostIP is the address of the pod's node.
	HostIP     string     `json:"hostIP,omitempty"`
	StartTime  *time.Time `json:"startTime,omitempty"`
	Conditions []struct {
		Type    string `json:"type"`
		Status  string `json:"status"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"conditions,omitempty"`
	ContainerStatuses []ContainerStatus `json:"containerStatuses,omitempty"`
}

// ContainerStatus is a container's state.
type ContainerStatus struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"`
	State struct {
		Running *struct {
			StartedAt time.Time `json:"startedAt"`
		} `json:"running,omitempty"`
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting,omitempty"`
		Terminated *struct {
			Reason   string `json:"reason"`
			ExitCode int    `json:"exitCode"`
		} `json:"terminated,omitempty"`
	} `json:"state"`
}

// Running reports whether container name of p runs.
func (p *Pod) Running(name string) bool {
	if p.Status.Phase != "Running" || p.Metadata.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == name {
			return c.State.Running != nil
		}
	}
	return false
}

// Unschedulable is why the scheduler places p nowhere ("" if it does
// not say so).
func (p *Pod) Unschedulable() string {
	for _, c := range p.Status.Conditions {
		if c.Type == "PodScheduled" && c.Status == "False" && c.Reason == "Unschedulable" {
			return c.Message
		}
	}
	return ""
}

// Waiting is why container name of p waits ("" if it does not): the
// kubelet's reason and message, such as ErrImagePull.
func (p *Pod) Waiting(name string) (reason, message string) {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == name && c.State.Waiting != nil {
			return c.State.Waiting.Reason, c.State.Waiting.Message
		}
	}
	return "", ""
}

// Event is the part of a core/v1 Event that hutch serve reads: what the
// kubelet reported of an object.
type Event struct {
	Reason         string `json:"reason"`
	Message        string `json:"message"`
	Type           string `json:"type"`
	InvolvedObject struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"involvedObject"`
}
