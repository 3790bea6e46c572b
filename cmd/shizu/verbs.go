package main

// verbs are the commands that talk to a running platform.
func verbs() map[string]verb {
	m := map[string]verb{}
	for _, v := range []verb{rentVerb, lsVerb, showVerb, stopVerb, billVerb, adviseVerb, nodesVerb, poolsVerb.with(poolsApplyVerb, poolsWithdrawVerb), trafficVerb, spotPriceVerb, chaosVerb,
		quotaVerb.with(quotaSetVerb, quotaShowVerb, quotaDeleteVerb),
		loginVerb, logoutVerb, tenantsVerb.with(tenantsLsVerb, tenantsCreateVerb, tenantsShowVerb), keysVerb.with(keysLsVerb, keysCreateVerb, keysRevokeVerb)} {
		m[v.name] = v
	}
	m[logsVerb.name] = logsVerb
	return m
}
