package engine

import "math/rand/v2"

// SessionAware keeps a session's requests on one engine of its group so that later turns
// reuse the engine's KV cache (POLICY_DESIGN section 5). The session key comes from the
// request (the handler reads it from the configured header, default x-session-id); bindings
// live in the shared AffinityStore, scoped by model, bucket and stage.
//
//   - A key bound to a candidate is reused whatever that engine's pressure, when it passes
//     this policy's admission (reason session_primary). A rejection returns AdmissionRejected
//     and leaves the binding: the bucket loop moves on, and the session comes back here next
//     turn.
//   - A new key, or one bound to an engine that has left the group, takes power_of_two with
//     default admission; this policy then checks that engine and only then binds it
//     (assigned, or session_rebound when it replaced an out-of-group binding).
//   - When a concurrent request bound the key first, that winner is checked and returned.
//   - A missing or empty key takes power_of_two and binds nothing (no_session).
//   - A lookup or bind that misses the store's deadline serves the engine the slow path
//     chooses (prefix holder or power_of_two, admitted) and binds nothing (store_timeout).
//
// A binding records placement, not dispatch: it stays when a later group of a PD bucket
// fails or when dispatch fails, and it never touches dispatch accounting.
type SessionAware struct {
	affinity
}

var _ Policy = (*SessionAware)(nil)

// NewSessionAware returns a session policy with admission adm, reading loads, keeping
// bindings in store, and sampling its power_of_two fallback from rng (owned by the policy
// from now on).
func NewSessionAware(adm EngineAdmission, loads LoadReader, store AffinityStore, rng *rand.Rand) *SessionAware {
	return &SessionAware{affinity{
		store:     store,
		admission: adm,
		loads:     loads,
		fallback:  NewPowerOfTwo(nil, loads, rng),
		reasons:   affinityReasons{noKey: ReasonNoSession, reuse: ReasonSessionPrimary, rebound: ReasonSessionRebound},
	}}
}

// Name implements Policy.
func (*SessionAware) Name() string { return PolicySessionAware }

// Pick implements Policy.
func (p *SessionAware) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	return p.pick(c, req, req.SessionKey)
}
