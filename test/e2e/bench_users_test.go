package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/coder/coder-k8s/internal/testenv"
)

// benchUsers is how many Coder users BenchmarkUsers seeds;
// BENCH_USERS overrides it (for a quick look; the figure is meant for
// 1,000).
const benchUsers = 1000

// BenchmarkUsers measures a LIST of every coderuser through
// kube-apiserver's aggregation layer against coderd's own GET
// /api/v2/users of the same users, with the same HTTP client and the same
// Coder user (the admin's certificate maps to the first user, whose token
// the coderd requests carry): medians of alternating requests after
// warm-ups. coderd v2.30 (coderd/users.go users, ParsePagination) takes a
// limit of 0, the default, as no limit: one GET without limit or offset
// returns every user, which is how the reference reads them; coder-k8s
// asks with a limit of 5000 per page, so one page here as well. The users
// are made with login type none, in parallel, with coderd's rate limits
// off.
func BenchmarkUsers(b *testing.B) {
	n := benchUsers
	if v := os.Getenv("BENCH_USERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("BENCH_USERS=%q: want a positive number", v)
		}
	}
	st := newBenchStack(b, 0, withCoder(testenv.CoderOptions{DisableRateLimits: true}))
	ctx := context.Background()
	st.seedUsers(b, ctx, n)
	agg := strings.TrimRight(st.k.Config.Host, "/") + "/apis/aggregation.coder.com/v1alpha1/namespaces/" + st.ns + "/coderusers"
	ref := st.coder.URL.String() + "/api/v2/users"

	// Every user coderd lists, the seeded ones and those the stack made
	// (the first user, coder-k8s's own).
	_, body, _, err := st.fetch(ref)
	if err != nil {
		b.Fatal(err)
	}
	total, err := usersCount(body)
	if err != nil {
		b.Fatal(err)
	}
	if total < n {
		b.Fatalf("coderd lists %d users, want at least %d", total, n)
	}

	b.ResetTimer()
	cold, body, _, err := st.fetch(agg)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "aggregated LIST", body, "items", total)
	fmt.Printf("users list: first aggregated LIST %s\n", cold.Round(time.Millisecond))
	aggMed, coderMed := st.alternate(b, agg, ref)
	b.StopTimer()
	ratio := reportRatio(b, "list", aggMed, coderMed)
	b.ReportMetric(float64(total), "users")
	st.usersBreakdown(b, agg)
	fmt.Printf("users list ratio=%.2f (target ≤ 1.2): aggregated LIST of %d coderusers median %s, coderd GET /api/v2/users (one request, no limit) median %s; %d alternating pairs\n",
		ratio, total, aggMed.Round(100*time.Microsecond), coderMed.Round(100*time.Microsecond), benchListPairs)
}

// usersCount is how many users a GET /api/v2/users answer holds.
func usersCount(body []byte) (int, error) {
	var res codersdk.GetUsersResponse
	if err := json.Unmarshal(body, &res); err != nil {
		return 0, fmt.Errorf("decode coderd's users: %w", err)
	}
	return len(res.Users), nil
}

// seedUsers makes n Coder users with login type none in the default
// organization, eight at a time.
func (st *benchStack) seedUsers(b *testing.B, ctx context.Context, n int) {
	b.Helper()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("bench-user-%04d", i)
			_, err := st.coder.Client.CreateUserWithOrgs(gctx, codersdk.CreateUserRequestWithOrgs{
				Email: name + "@example.com", Username: name, Name: fmt.Sprintf("Bench User %d", i),
				UserLoginType: codersdk.LoginTypeNone, OrganizationIDs: []uuid.UUID{st.coder.OrganizationID}})
			if err != nil {
				return fmt.Errorf("create user %s: %w", name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("users: %d users (login type none) seeded in %s\n", n, time.Since(start).Round(time.Millisecond))
}

// usersBreakdown shows where the aggregated LIST's time goes: through
// kube-apiserver (gzip accepted, as kubectl and the figure ask, and
// without: coderd compresses no API answer), at resourceVersion 0 (the
// same answer from coder-k8s's watch cache, which reads nothing from
// coderd: every hop and coder-k8s's serving of the answer, without the
// read of coderd and its conversion) and straight to coder-k8s, next to
// what coder-k8s asks coderd for (the users list and, when the last read
// is older than the poll interval, the organizations and the default
// organization's members).
func (st *benchStack) usersBreakdown(b *testing.B, agg string) {
	b.Helper()
	direct := st.op.Aggregated + "/apis/aggregation.coder.com/v1alpha1/namespaces/" + st.ns + "/coderusers"
	base := st.coder.URL.String() + "/api/v2"
	printBreakdown(b, "users list", []breakdownStep{
		st.getStep("through kube-apiserver", agg),
		{name: "through kube-apiserver uncompressed", f: func() (time.Duration, error) { d, _, _, err := timedGet(st.hc, agg, "identity"); return d, err }},
		st.getStep("through kube-apiserver at resourceVersion 0", agg+"?resourceVersion=0"),
		st.getStep("coder-k8s directly", direct),
		st.getStep("coderd users list", base+"/users"),
		st.getStep("coderd users list (limit 5000)", base+"/users?limit=5000"),
		st.getStep("coderd organization members", base+"/organizations/"+st.coder.OrganizationID.String()+"/members"),
		st.getStep("coderd organizations", base+"/organizations"),
	})
}
