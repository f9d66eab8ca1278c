// Package event records Kubernetes Events about liken's objects, in order, and can wait until
// everything recorded so far has reached the API server. client-go's broadcaster sends Events
// from a goroutine nobody can wait for, so an Event recorded just before a reboot was lost
// whenever init stopped the agent before the goroutine got to it (on fast machines, always).
// Here an Event is queued, sent by one sender in the order recorded, retried while the API
// server is away, and Flush says which ones have not been sent yet, so a machine going down
// can keep them and send them after the next boot.
package event

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/reference"
)

// Event is one Event still to be sent. It is what a machine keeps across a reboot when the
// API server could not take it in time, so it is plain data with stable JSON.
type Event struct {
	// Name is the Event object's name, fixed when it is recorded, so a resend after an
	// uncertain first attempt finds the first one instead of making a duplicate.
	Name    string                 `json:"name"`
	Object  corev1.ObjectReference `json:"object"`
	Type    string                 `json:"type"`
	Reason  string                 `json:"reason"`
	Message string                 `json:"message"`
	At      metav1.Time            `json:"at"`
}

// key groups repeats of the same Event about the same object, as kubectl shows them: one
// object with a count.
func (e Event) key() string {
	return string(e.Object.UID) + "\x00" + e.Object.Name + "\x00" + e.Type + "\x00" + e.Reason + "\x00" + e.Message
}

// Config is what a Recorder needs.
type Config struct {
	// Events is where Events are written, in Namespace (liken's objects are cluster-scoped,
	// so their Events live in one namespace, as client-go puts them).
	Events    typedcorev1.EventInterface
	Namespace string
	Scheme    *runtime.Scheme
	Source    corev1.EventSource
	Log       *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Recorder queues Events and sends them in order.
type Recorder struct {
	cfg Config

	mu sync.Mutex
	// queue holds the Events not sent yet; the sender works on the first.
	queue []Event
	// wake tells the sender there is work; idle is closed and replaced whenever the queue
	// empties, for Flush.
	wake chan struct{}
	idle chan struct{}
	// sent remembers the Events already written, by key, so a repeat raises the count.
	sent map[string]*sent
}

type sent struct {
	name  string
	count int32
	last  time.Time
}

// repeatWindow is how long a repeat of an Event raises its count instead of making a new one.
const repeatWindow = 10 * time.Minute

// New makes a Recorder. Nothing is sent before Run.
func New(cfg Config) *Recorder {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Recorder{cfg: cfg, wake: make(chan struct{}, 1), idle: make(chan struct{}), sent: map[string]*sent{}}
}

// Event records an Event about obj.
func (r *Recorder) Event(obj runtime.Object, typ, reason, message string) {
	ref, err := reference.GetReference(r.cfg.Scheme, obj)
	if err != nil {
		r.cfg.Log.Error("recording an Event: no reference to its object", "reason", reason, "err", err)
		return
	}
	now := r.cfg.Now()
	r.add(Event{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Object: *ref, Type: typ, Reason: reason, Message: message,
		At: metav1.NewTime(now)})
}

// Eventf records an Event about obj with a formatted message.
func (r *Recorder) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	r.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

// Resend queues Events kept from before (a boot that went down before they were sent),
// before anything recorded since, with note added to each message.
func (r *Recorder) Resend(evs []Event, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	late := make([]Event, 0, len(evs)+len(r.queue))
	for _, e := range evs {
		if note != "" {
			e.Message += " (" + note + ")"
		}
		late = append(late, e)
	}
	r.queue = append(late, r.queue...)
	r.poke()
}

func (r *Recorder) add(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue = append(r.queue, e)
	r.poke()
}

func (r *Recorder) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Flush waits until every Event recorded so far has been sent, or ctx ends. It returns the
// Events not sent by then, oldest first (none when all were), and leaves them queued: the
// sender keeps trying while the process lives.
func (r *Recorder) Flush(ctx context.Context) []Event {
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.mu.Unlock()
			return nil
		}
		idle := r.idle
		r.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			return append([]Event(nil), r.queue...)
		}
	}
}

// Run sends queued Events until ctx ends, retrying each with backoff while the API server
// cannot take it. An Event the API server refuses for good (invalid, or forbidden for longer
// than RefusalGrace) is logged and dropped: retrying cannot change that answer.
func (r *Recorder) Run(ctx context.Context) {
	backoff := 200 * time.Millisecond
	var refusedSince time.Time // when the API server first refused the queue's head
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			close(r.idle)
			r.idle = make(chan struct{})
			r.mu.Unlock()
			select {
			case <-r.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		e := r.queue[0]
		r.mu.Unlock()

		err := r.send(ctx, e)
		if err != nil && refusable(err) {
			if refusedSince.IsZero() {
				refusedSince = time.Now()
			}
			if time.Since(refusedSince) < RefusalGrace {
				err = notYet{err} // retried below
			}
		}
		r.mu.Lock()
		if err == nil || permanent(err) {
			r.queue = r.queue[1:]
			refusedSince = time.Time{}
		}
		r.mu.Unlock()
		switch {
		case err == nil:
			backoff = 200 * time.Millisecond
		case permanent(err):
			r.cfg.Log.Error("the API server refused an Event; dropped", "reason", e.Reason, "message", e.Message, "err", err)
		default:
			r.cfg.Log.Debug("sending an Event; retrying", "reason", e.Reason, "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, 10*time.Second)
		}
	}
}

// RefusalGrace is how long an Event the API server refuses as forbidden or unauthorized is
// tried again before it is dropped. Such a refusal is not final at first: an API server that
// has just started answers 403 until its authorizer's caches have synced, and on a new
// cluster the machines' RBAC is applied from k3s's manifests only after the API answers.
var RefusalGrace = 2 * time.Minute

func refusable(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
}

// notYet is a refusal still within RefusalGrace.
type notYet struct{ error }

func permanent(err error) bool {
	if _, ok := err.(notYet); ok {
		return false
	}
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsUnauthorized(err)
}

// send writes one Event: a repeat of one sent in the last repeatWindow raises that one's
// count; anything else is created under the name fixed when it was recorded.
func (r *Recorder) send(ctx context.Context, e Event) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r.mu.Lock()
	prev := r.sent[e.key()]
	r.mu.Unlock()
	if prev != nil && e.At.Sub(prev.last) < repeatWindow && e.At.Sub(prev.last) >= 0 {
		patch, _ := json.Marshal(map[string]any{"count": prev.count + 1, "lastTimestamp": e.At})
		_, err := r.cfg.Events.Patch(ctx, prev.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			r.mu.Lock()
			prev.count++
			prev.last = e.At.Time
			r.mu.Unlock()
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("raising the count of Event %s: %w", prev.name, err)
		}
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: e.Name, Namespace: r.cfg.Namespace},
		InvolvedObject: e.Object,
		Type:           e.Type, Reason: e.Reason, Message: e.Message,
		FirstTimestamp: e.At, LastTimestamp: e.At, Count: 1,
		Source:              r.cfg.Source,
		ReportingController: "liken.dev/" + r.cfg.Source.Component, ReportingInstance: r.cfg.Source.Host,
	}
	_, err := r.cfg.Events.Create(ctx, ev, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// An earlier attempt got through although its answer did not.
		err = nil
	}
	if err != nil {
		return fmt.Errorf("creating Event %s: %w", e.Name, err)
	}
	r.mu.Lock()
	r.sent[e.key()] = &sent{name: e.Name, count: 1, last: e.At.Time}
	r.mu.Unlock()
	return nil
}
