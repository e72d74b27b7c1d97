package engine

// Sticky pins each routing key to one engine of its group (the handler reads the key from
// the configured header, default x-sgl-routing-key); bindings live in the shared
// AffinityStore, scoped by model, bucket and stage.
//
//   - A key bound to a candidate is reused when it passes this policy's admission (hit); a
//     rejection returns AdmissionRejected and keeps the binding.
//   - A new key takes the fallback (round_robin, random, power_of_two or load_based, built
//     with default admission); this policy checks the fallback's engine and binds it
//     (assigned).
//   - A key is re-pinned only when its engine has left the candidate set (removed, unhealthy,
//     or no longer a member): remap. Adding engines never moves an existing key.
//   - A missing or empty key takes the fallback and binds nothing (no_routing_key).
//   - A lookup or bind that misses the store's deadline serves the engine the slow path
//     chooses (prefix holder or fallback, admitted) and binds nothing (store_timeout): the
//     key loses its engine for this request, not the request.
type Sticky struct {
	affinity
}

var _ Policy = (*Sticky)(nil)

// NewSticky returns a sticky policy with admission adm, reading loads, keeping bindings in
// store, and asking fallback for new or missing keys. fallback is owned by the policy from now
// on and should have default admission: this policy checks the engine it returns.
func NewSticky(adm EngineAdmission, loads LoadReader, store AffinityStore, fallback Policy) *Sticky {
	return &Sticky{affinity{
		store:     store,
		admission: adm,
		loads:     loads,
		fallback:  fallback,
		reasons:   affinityReasons{noKey: ReasonNoRoutingKey, reuse: ReasonHit, rebound: ReasonRemap},
	}}
}

// Name implements Policy.
func (*Sticky) Name() string { return PolicySticky }

// Fallback returns the policy choosing engines for new or missing keys.
func (p *Sticky) Fallback() Policy { return p.fallback }

// Pick implements Policy.
func (p *Sticky) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	return p.pick(c, req, req.RoutingKey)
}
