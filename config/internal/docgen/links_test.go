package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

const repoRoot = "../../.."

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
)

// TestDocsLinksResolve checks the README and every page under docs/: each relative link
// names a file that exists and, with a #fragment, a heading of that file (GitHub's anchor
// rule), and the README links every page, so a page moved, renamed or added without a
// link is caught here.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs pages: %v", err)
	}
	files := append([]string{filepath.Join(repoRoot, "README.md")}, pages...)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		anchors[path] = headingAnchors(t, path)
		return anchors[path]
	}
	linked := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(src), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, frag, _ := strings.Cut(link, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
			}
			rel, _ := filepath.Rel(repoRoot, f)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %q: no such file", rel, link)
				continue
			}
			if filepath.Base(f) == "README.md" {
				linked[filepath.Clean(path)] = true
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: link %q: no heading with that anchor", rel, link)
			}
		}
	}
	for _, p := range pages {
		if !linked[filepath.Clean(p)] {
			t.Errorf("README.md does not link docs/%s", filepath.Base(p))
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown file:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(m[1])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a += "-" + strconv.Itoa(n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}
