package config

// EffectivePolicy returns the policy a group of the given model and role runs: the
// group's own policy, else the model's default for that stage, else the configuration's
// DefaultPolicy (round_robin with default admission unless set). A sticky policy without
// a fallback gets round_robin. The result is a deep copy the caller may keep; g may be nil.
func (c *Config) EffectivePolicy(model string, role Role, g *Group) Policy {
	var out Policy
	switch {
	case g != nil && g.Policy != nil:
		out = g.Policy.clone()
	case c.Models[model].Policies.forRole(role) != nil:
		out = c.Models[model].Policies.forRole(role).clone()
	default:
		out = c.DefaultPolicy.clone()
		if out.Type == "" {
			out.Type = PolicyRoundRobin
		}
	}
	if out.Type == PolicySticky && out.Fallback == "" {
		out.Fallback = PolicyRoundRobin
	}
	return out
}

// forRole returns the stage default for role, or nil.
func (s StagePolicies) forRole(role Role) *Policy {
	switch role {
	case RolePlain:
		return s.Plain
	case RolePrefill:
		return s.Prefill
	case RoleDecode:
		return s.Decode
	}
	return nil
}

// clone deep-copies the policy, including its admission caps.
func (p Policy) clone() Policy {
	p.Admission = p.Admission.clone()
	return p
}

// clone deep-copies the caps.
func (a Admission) clone() Admission {
	cp := func(v *int64) *int64 {
		if v == nil {
			return nil
		}
		n := *v
		return &n
	}
	return Admission{
		MaxRunningRequests:      cp(a.MaxRunningRequests),
		MaxWaitingRequests:      cp(a.MaxWaitingRequests),
		MaxKVTokens:             cp(a.MaxKVTokens),
		MaxPendingPrefillTokens: cp(a.MaxPendingPrefillTokens),
		MaxInflightRequests:     cp(a.MaxInflightRequests),
	}
}
