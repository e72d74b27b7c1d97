package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"switchyard/config"
)

// TestMigratingPageListsEverySGLRouterFlag: the migration page, the flag table's home, names
// every sgl-router flag the compatibility mode maps or refuses.
func TestMigratingPageListsEverySGLRouterFlag(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "docs", "migrating-from-sgl-router.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(src)
	for _, name := range config.SGLRouterFlags() {
		if strings.HasPrefix(name, "jwt-") && strings.Contains(page, "`--jwt-*`") {
			continue
		}
		if !strings.Contains(page, "`--"+name+"`") && !strings.Contains(page, "`--"+name+" ") {
			t.Errorf("docs/migrating-from-sgl-router.md does not name --%s", name)
		}
	}
}
