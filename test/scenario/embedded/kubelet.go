package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/test/scenario"
)

// kubelet stands in for the kubelet of every node: when it sees a pod's
// deletionTimestamp it runs, in the pod's own goroutine as the kubelet's pod
// worker would, the preStop hook, reports the pod not ready, stops it, and
// removes the object (the grace-0 delete of a real kubelet).
type kubelet struct {
	client kubernetes.Interface
	log    *slog.Logger

	mu    sync.Mutex
	hooks map[string]scenario.PodHooks // namespace/name
	seen  map[types.UID]bool
	wg    sync.WaitGroup
}

func newKubelet(client kubernetes.Interface, log *slog.Logger) *kubelet {
	return &kubelet{client: client, log: log, hooks: map[string]scenario.PodHooks{}, seen: map[types.UID]bool{}}
}

func (k *kubelet) register(namespace, name string, h scenario.PodHooks) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hooks[namespace+"/"+name] = h
}

func (k *kubelet) forget(namespace string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key := range k.hooks {
		if ns, _, _ := strings.Cut(key, "/"); ns == namespace {
			delete(k.hooks, key)
		}
	}
}

// podChanged is the pod informer's handler.
func (k *kubelet) podChanged(ctx context.Context, pod *corev1.Pod) {
	if pod.DeletionTimestamp == nil {
		return
	}
	k.mu.Lock()
	h, ok := k.hooks[pod.Namespace+"/"+pod.Name]
	first := !k.seen[pod.UID]
	k.seen[pod.UID] = true
	k.mu.Unlock()
	if !ok || !first {
		return
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		err := k.terminate(ctx, pod.Namespace, pod.Name, h)
		if h.Gone != nil {
			h.Gone(err)
		}
	}()
}

func (k *kubelet) terminate(ctx context.Context, namespace, name string, h scenario.PodHooks) error {
	if h.PreStop != nil {
		if err := h.PreStop(ctx); err != nil {
			// The kubelet logs a failed preStop and carries on.
			k.log.Warn("preStop failed", "pod", namespace+"/"+name, "err", err)
		}
	}
	if err := setReady(ctx, k.client, namespace, name, false); err != nil {
		return err
	}
	var errs []error
	if h.Stop != nil {
		if err := h.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping pod %s/%s: %w", namespace, name, err))
		}
	}
	if err := k.client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		errs = append(errs, fmt.Errorf("removing pod %s/%s: %w", namespace, name, err))
	}
	return errors.Join(errs...)
}

// wait waits for the terminations in progress.
func (k *kubelet) wait() { k.wg.Wait() }

// setReady sets the pod's Ready and ContainersReady conditions.
func setReady(ctx context.Context, client kubernetes.Interface, namespace, name string, ready bool) error {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("setting pod %s/%s ready=%t: %w", namespace, name, ready, err)
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
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
	if _, err := client.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting pod %s/%s ready=%t: %w", namespace, name, ready, err)
	}
	return nil
}
