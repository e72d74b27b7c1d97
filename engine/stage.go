package engine

import "switchyard/config"

// Stage is the serving stage a group selects for: plain, prefill or decode. A worker's role
// label is authoritative: a group of one stage only ever sees workers of that role.
type Stage uint8

// Stages.
const (
	StagePlain Stage = iota
	StagePrefill
	StageDecode
	numStages
)

var stageNames = [numStages]string{"plain", "prefill", "decode"}

// String returns the stage's configuration name.
func (s Stage) String() string {
	if s < numStages {
		return stageNames[s]
	}
	return "unknown"
}

// StageOf maps a configured role to its stage; ok is false for an unknown role.
func StageOf(r config.Role) (s Stage, ok bool) {
	switch r {
	case config.RolePlain, "":
		return StagePlain, true
	case config.RolePrefill:
		return StagePrefill, true
	case config.RoleDecode:
		return StageDecode, true
	}
	return 0, false
}
