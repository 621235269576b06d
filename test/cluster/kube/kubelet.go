package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// Kubelet stands in for the kubelet of one node: the bed runs the pods'
// processes itself (network namespaces, not containers), and this type keeps
// their API objects in step the way the kubelet would.
type Kubelet struct {
	Client   kubernetes.Interface
	NodeName string
	NodeIPs  []netip.Addr
	// Log receives warnings; nil means slog.Default().
	Log *slog.Logger
}

// Kubelet returns the stand-in kubelet of node n, acting with admin rights.
func (c *Cluster) Kubelet(n *Node) *Kubelet {
	return &Kubelet{Client: c.Admin, NodeName: n.Name, NodeIPs: n.InternalIPs, Log: c.log}
}

// RunPod creates pod bound to this node and reports it running and ready
// with the given pod IPs (first is the primary), as the kubelet does once
// the pod's containers have started and passed readiness. pod.Spec.NodeName
// is set; a pod without containers gets one placeholder container.
func (k *Kubelet) RunPod(ctx context.Context, pod *corev1.Pod, ips ...netip.Addr) (*corev1.Pod, error) {
	ips = slices.DeleteFunc(slices.Clone(ips), func(ip netip.Addr) bool { return !ip.IsValid() }) // single-stack
	if len(ips) == 0 || len(k.NodeIPs) == 0 {
		return nil, fmt.Errorf("running pod %s/%s: pod IPs and node IPs are required", pod.Namespace, pod.Name)
	}
	pod = pod.DeepCopy()
	pod.Spec.NodeName = k.NodeName
	if len(pod.Spec.Containers) == 0 {
		pod.Spec.Containers = []corev1.Container{{Name: "server", Image: "draind.test/bed-pod"}}
	}
	created, err := k.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	now := metav1.Now()
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    k.NodeIPs[0].String(),
		PodIP:     ips[0].String(),
		StartTime: &now,
		QOSClass:  corev1.PodQOSBestEffort,
	}
	for _, ip := range k.NodeIPs {
		st.HostIPs = append(st.HostIPs, corev1.HostIP{IP: ip.String()})
	}
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodScheduled, corev1.ContainersReady, corev1.PodReady} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	for _, ctr := range created.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name:        ctr.Name,
			Image:       ctr.Image,
			ImageID:     ctr.Image,
			ContainerID: "bed://" + string(created.UID) + "/" + ctr.Name,
			Ready:       true,
			Started:     ptr(true),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	created.Status = st
	updated, err := k.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("setting status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return updated, nil
}

// SetReady sets the pod's Ready and ContainersReady conditions (and its
// containers' ready flags), as the kubelet does when readiness changes or,
// for a terminating pod, when its containers stop.
func (k *Kubelet) SetReady(ctx context.Context, namespace, name string, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := k.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		for i, c := range pod.Status.Conditions {
			if (c.Type == corev1.PodReady || c.Type == corev1.ContainersReady) && c.Status != status {
				pod.Status.Conditions[i].Status = status
				pod.Status.Conditions[i].LastTransitionTime = now
			}
		}
		for i := range pod.Status.ContainerStatuses {
			pod.Status.ContainerStatuses[i].Ready = ready
		}
		_, err = k.Client.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("setting pod %s/%s ready=%t: %w", namespace, name, ready, err)
	}
	return nil
}

// ForceDelete removes the pod object with grace period 0: the kubelet's last
// step once the pod's containers are gone.
func (k *Kubelet) ForceDelete(ctx context.Context, namespace, name string) error {
	zero := int64(0)
	if err := k.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return fmt.Errorf("force-deleting pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Terminate does what the kubelet does for a gracefully deleted pod: run
// preStop (if any), report the pod not ready, stop its processes (stop, if
// any), and remove the pod object. The caller decides when to call it —
// typically on seeing the pod's deletionTimestamp.
func (k *Kubelet) Terminate(ctx context.Context, namespace, name string, preStop, stop func(context.Context) error) error {
	if preStop != nil {
		if err := preStop(ctx); err != nil {
			// The kubelet logs a failed preStop and carries on killing the pod.
			k.log().Warn("preStop failed", "node", k.NodeName, "pod", namespace+"/"+name, "err", err)
		}
	}
	if err := k.SetReady(ctx, namespace, name, false); err != nil {
		return fmt.Errorf("terminating pod %s/%s: %w", namespace, name, err)
	}
	if stop != nil {
		if err := stop(ctx); err != nil {
			return fmt.Errorf("terminating pod %s/%s: stopping its processes: %w", namespace, name, err)
		}
	}
	return k.ForceDelete(ctx, namespace, name)
}

func (k *Kubelet) log() *slog.Logger {
	if k.Log == nil {
		return slog.Default()
	}
	return k.Log
}

func ptr[T any](v T) *T { return &v }

// OnDeletion calls handle, in its own goroutine, once for every pod on this
// node whose deletionTimestamp appears (a graceful delete), as the kubelet
// starts terminating a pod when it sees that. handle typically ends with
// Terminate. It returns once the pod watch has synced; stop ends the watch
// (handlers already started keep running).
func (k *Kubelet) OnDeletion(ctx context.Context, handle func(ctx context.Context, pod *corev1.Pod)) (stop func(), err error) {
	wctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(k.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.NodeName).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	var mu sync.Mutex
	seen := map[types.UID]bool{}
	check := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.DeletionTimestamp == nil || pod.Spec.NodeName != k.NodeName {
			return
		}
		mu.Lock()
		first := !seen[pod.UID]
		seen[pod.UID] = true
		mu.Unlock()
		if first {
			go handle(wctx, pod.DeepCopy())
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, o any) { check(o) },
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("watching pods of node %s: %w", k.NodeName, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.Run(wctx.Done())
	}()
	stop = func() {
		cancel()
		<-done
	}
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		stop()
		return nil, fmt.Errorf("watching pods of node %s: %w", k.NodeName, context.Cause(ctx))
	}
	return stop, nil
}
