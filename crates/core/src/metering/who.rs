//! The word a meter keeps of who its key was when counted: the policy's generation, its plan
//! and partner, whether it is a partner key (the ledger's row names them from it).

/// The [`Meter::who`](super::Meter::who) word of a key counted under the policy `generation`: its plan (a
/// customer key) and partner (a partner key's own, or the partner managing a customer key).
pub fn who(generation: u32, plan: Option<usize>, partner: Option<usize>, partner_key: bool) -> u64 {
    let plan = plan.map_or(0, |p| (p as u64 + 1) & 0xFFFF);
    let partner = partner.map_or(0, |p| (p as u64 + 1) & 0x7FFF);
    (u64::from(generation) << 32) | (u64::from(partner_key) << 31) | (partner << 16) | plan
}

/// What a [`who`] word says: (generation, plan, partner, a partner key).
pub fn who_parts(w: u64) -> (u32, Option<usize>, Option<usize>, bool) {
    let plan = (w & 0xFFFF) as usize;
    let partner = ((w >> 16) & 0x7FFF) as usize;
    (
        (w >> 32) as u32,
        plan.checked_sub(1),
        partner.checked_sub(1),
        w & (1 << 31) != 0,
    )
}
