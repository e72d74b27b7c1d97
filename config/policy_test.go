package config

import "testing"

func TestEffectivePolicy(t *testing.T) {
	c := Default()
	c.DefaultPolicy = Policy{Type: PolicyLoadBased, Admission: Admission{MaxInflightRequests: ptr[int64](9)}}
	c.Models = map[string]Model{
		"pd": {Policies: StagePolicies{
			Prefill: &Policy{Type: PolicyCacheAware, Admission: Admission{MaxRunningRequests: ptr[int64](64)}},
			Decode:  &Policy{Type: PolicySticky},
		}},
		"plain": {Policies: StagePolicies{Plain: &Policy{Type: PolicySessionAware}}},
	}
	own := &Group{Policy: &Policy{Type: PolicySticky, Fallback: PolicyPowerOfTwo}}
	tests := []struct {
		name         string
		model        string
		role         Role
		g            *Group
		wantType     string
		wantFallback string
		wantInflight int64 // -1: unset
		wantRunning  int64
	}{
		{"group policy wins", "pd", RolePrefill, own, PolicySticky, PolicyPowerOfTwo, -1, -1},
		{"prefill stage default", "pd", RolePrefill, &Group{}, PolicyCacheAware, "", -1, 64},
		{"decode stage default sticky gets round_robin fallback", "pd", RoleDecode, &Group{}, PolicySticky, PolicyRoundRobin, -1, -1},
		{"plain stage default", "plain", RolePlain, nil, PolicySessionAware, "", -1, -1},
		{"no plain default on pd model", "pd", RolePlain, &Group{}, PolicyLoadBased, "", 9, -1},
		{"no prefill default on plain model", "plain", RolePrefill, nil, PolicyLoadBased, "", 9, -1},
		{"unknown model", "nope", RoleDecode, nil, PolicyLoadBased, "", 9, -1},
		{"unknown role", "pd", Role("x"), nil, PolicyLoadBased, "", 9, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := c.EffectivePolicy(tt.model, tt.role, tt.g)
			inflight, running := int64(-1), int64(-1)
			if p := got.Admission.MaxInflightRequests; p != nil {
				inflight = *p
			}
			if p := got.Admission.MaxRunningRequests; p != nil {
				running = *p
			}
			if got.Type != tt.wantType || got.Fallback != tt.wantFallback || inflight != tt.wantInflight || running != tt.wantRunning {
				t.Errorf("EffectivePolicy = %+v (inflight %d running %d), want %s/%q inflight %d running %d",
					got, inflight, running, tt.wantType, tt.wantFallback, tt.wantInflight, tt.wantRunning)
			}
		})
	}

	t.Run("round_robin with default admission when nothing is set", func(t *testing.T) {
		var empty Config
		got := empty.EffectivePolicy("m", RolePlain, nil)
		if got.Type != PolicyRoundRobin || got.Admission != (Admission{}) || got.Fallback != "" {
			t.Errorf("EffectivePolicy = %+v", got)
		}
		if got := Default().EffectivePolicy("m", RoleDecode, &Group{}); got.Type != PolicyRoundRobin || got.Admission != (Admission{}) {
			t.Errorf("Default().EffectivePolicy = %+v", got)
		}
	})

	t.Run("result is a deep copy", func(t *testing.T) {
		got := c.EffectivePolicy("pd", RolePrefill, &Group{})
		*got.Admission.MaxRunningRequests = 1
		got.Type = PolicyRandom
		if p := c.Models["pd"].Policies.Prefill; *p.Admission.MaxRunningRequests != 64 || p.Type != PolicyCacheAware {
			t.Errorf("EffectivePolicy aliases the configuration: %+v", p)
		}
	})
}
